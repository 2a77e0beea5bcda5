"""Parsing a safetensors header without loading any tensor: the adapter's and every base shard's.

The file layout is: 8 bytes little-endian header length N, N bytes of JSON (`{name: {dtype, shape,
data_offsets}}` plus an optional `__metadata__`), then the tensors' bytes, offsets relative to the
end of the header. Checks here are the ones the safetensors library itself makes (sizes match
dtype x shape, data is contiguous, nothing overlaps or runs past the file), so a header that
passes describes exactly the bytes the merge will read.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER = 100 << 20  # the safetensors library's own limit


class HeaderError(ValueError):
    """The header is unreadable; `overlap` names two tensors whose bytes overlap, if that is why."""

    def __init__(self, message: str, overlap: tuple[str, str] | None = None):
        super().__init__(message)
        self.overlap = overlap


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offsets, header included
    end: int


@dataclass(frozen=True)
class Header:
    prefix: bytes  # the 8 length bytes and the JSON header, byte for byte
    entries: tuple[Entry, ...]  # in file order
    size: int  # the whole file's size

    @property
    def data_start(self) -> int:
        return len(self.prefix)

    def by_name(self) -> dict[str, Entry]:
        return {e.name: e for e in self.entries}


def read_header(read: Callable[[int, int], bytes], size: int) -> Header:
    """Parse the header of a `size`-byte file whose bytes [start, end) `read(start, end)` returns."""
    if size < 8:
        raise HeaderError(f"the file has {size} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", read(0, 8))
    if n > MAX_HEADER or 8 + n > size:
        raise HeaderError(f"the header length {n} does not fit a {size}-byte file")
    prefix = read(0, 8 + n)
    if len(prefix) != 8 + n:
        raise HeaderError("the file ended inside its header")
    try:
        raw = json.loads(prefix[8:])
    except (UnicodeDecodeError, ValueError):
        raise HeaderError("the header is not JSON") from None
    if not isinstance(raw, dict):
        raise HeaderError("the header is not a JSON object")
    meta = raw.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise HeaderError("__metadata__ is not a map of strings")
    entries = sorted((_entry(name, spec, 8 + n) for name, spec in raw.items()), key=lambda e: (e.start, e.end))
    _check_layout(entries, 8 + n, size)
    return Header(prefix=prefix, entries=tuple(entries), size=size)


def _entry(name: str, spec: object, data_start: int) -> Entry:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise HeaderError(f"tensor {name} is not described by dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in ITEMSIZE:
        raise HeaderError(f"tensor {name} has an unknown dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise HeaderError(f"tensor {name} has an invalid shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise HeaderError(f"tensor {name} has invalid data_offsets")
    start, end = offsets
    if end - start != math.prod(shape) * ITEMSIZE[dtype]:
        raise HeaderError(f"tensor {name}'s data_offsets do not span its dtype and shape")
    return Entry(name, dtype, tuple(shape), data_start + start, data_start + end)


def _check_layout(entries: list[Entry], data_start: int, size: int) -> None:
    pos = data_start
    previous = None
    for e in entries:
        if e.start < pos and previous is not None:
            raise HeaderError(f"tensors {previous.name} and {e.name} overlap", overlap=(previous.name, e.name))
        if e.start != pos:
            raise HeaderError(f"tensor {e.name} does not start where the previous tensor ends")
        pos, previous = e.end, e
    if pos != size:
        raise HeaderError(f"the header describes {pos} bytes but the file has {size}")


def file_reader(path) -> Callable[[int, int], bytes]:
    """`read(start, end)` over a local file, for `read_header`."""

    def read(start: int, end: int) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    return read
