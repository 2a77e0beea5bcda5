"""Local stores with a fault on the way to disk: one corrupts config.json (the read-back test), one
ends the shard task's process as it starts writing its shard (a worker lost mid-merge).

Its own small module because the shard tasks receive the store pickled, and Ray workers import
the class's module (keeping peft and transformers out of them).
"""

from __future__ import annotations

import os

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


class DyingStore(LocalObjectStore):
    """Ends the process writing a shard, once it is not the one that made the store: the shard
    task's Ray worker exits, as it does when its node goes down. The driver is never the one ended."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.maker_pid = os.getpid()

    def writer(self, key):
        if key.endswith(".safetensors") and os.getpid() != self.maker_pid:
            os._exit(1)
        return super().writer(key)
