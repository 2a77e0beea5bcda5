"""A local store that corrupts config.json on its way to disk: the seam for the read-back test.

Its own small module because the shard tasks receive the store pickled, and Ray workers import
the class's module (keeping peft and transformers out of them).
"""

from __future__ import annotations

from storage.objects import LocalObjectStore


class CorruptingStore(LocalObjectStore):
    """Flips one byte of config.json on its way to disk, after the merge computed its digest."""

    def writer(self, key):
        inner = super().writer(key)
        if not key.endswith("/config.json"):
            return inner
        return _Flipping(inner)


class _Flipping:
    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        w = self.inner.__enter__()
        original = w.write

        def write(b):
            b = bytearray(b)
            b[0] ^= 0xFF
            original(bytes(b))
            w.bytes_written = len(b)  # the writer reports what it was given

        w.write = write
        return w

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)
