"""The per-shard merge task: stream one base shard into the export, adding `B·A × scale` to its
adapted weights, and check every byte on the way.

Third step of the flow: `merge/run.py` runs `merge_shard` as one Ray task per shard. The output's
header is the base's header byte for byte (a bf16 weight stays bf16, so no size or offset changes),
written first; then each tensor's bytes in file order: unadapted ones copied in chunks, adapted
ones merged in fp32 and rounded once to bf16, a buffer of rows at a time. Memory stays at that
buffer, whatever the shard's or the weight's size. The base's bytes are hashed as they are read
and checked against the pinned SHA-256 before the atomic writer publishes the shard; then the
stored shard is read back and its digest compared.

The base is read with positional reads into buffers allocated once per task, not through a memory
map: each mapped page costs a fault on first touch (and again after it is dropped to keep memory
bounded), which made the map 35% slower per shard on a 2-core machine (`bench/merge.py`). Reads
also turn a file that shrinks mid-merge into `merge_source_short` instead of a SIGBUS.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO, Iterator

import numpy as np
import torch

from merge.errors import MergeError
from merge.export import readback
from merge.plan import ShardJob, Target
from storage.objects import ObjectStore, aligned_buffer, pread_full

CHUNK = 16 << 20
ROW_BLOCK = 1 << 20  # fp32 elements of a weight merged at once (4 MiB)
MIN_ROWS = 16  # rows of B in every matmul (see merge_rows)
_FACTOR_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def merge_shard(
    job: ShardJob, base_file: str, store: ObjectStore, key: str, adapter: np.ndarray, scale: float, chunk_bytes: int = CHUNK
) -> dict:
    """Write the merged `job` shard under `key` and return its `{path, bytes, sha256, modified}`.

    `adapter` is the whole adapter file's bytes (uint8); the targets' factor offsets index into it.
    """
    base_hash = hashlib.sha256()
    # Input and output are the same bytes up to the first adapted weight, so one digest serves both
    # until there and is forked (`copy()`: SHA-256's running state) where they part; an unadapted
    # shard never forks. The bytes before it (an embedding, say) are hashed once, not twice.
    out_hash = base_hash
    chunk = aligned_buffer(chunk_bytes)
    with open(base_file, "rb", buffering=0) as fh:
        src = _Source(fh, job)
        if hashlib.sha256(src.read(0, job.data_start)).hexdigest() != job.header_sha256:
            raise MergeError("merge_source_header", f"The base shard {job.path}'s header changed while it was read.")
        with store.writer(key) as w:
            pos = 0
            for target in job.targets:
                _copy_through(src.chunks(pos, target.start, chunk), w, base_hash, out_hash)
                if out_hash is base_hash:
                    out_hash = base_hash.copy()
                for rows, merge in _weight_rows(src, target, adapter, scale, chunk):
                    base_hash.update(rows)
                    merge()  # over the same bytes
                    out_hash.update(rows)
                    w.write(rows)
                pos = target.end
            _copy_through(src.chunks(pos, job.size, chunk), w, base_hash, out_hash)
            if base_hash.hexdigest() != job.sha256:
                raise MergeError("merge_base_digest", f"The base file {job.path}'s bytes do not match its pinned SHA-256.")
            if w.bytes_written != job.size:
                raise MergeError("merge_output_size", f"The merged {job.path} has {w.bytes_written} bytes, the base's {job.size}.")
    digest = out_hash.hexdigest()
    readback(store, key, job.size, digest, chunk)
    return {"path": job.path, "bytes": job.size, "sha256": digest, "modified": bool(job.targets)}


def _copy_through(parts: Iterator[memoryview], w, base_hash, out_hash) -> None:
    """Unadapted bytes: the same in input and output (one digest while the two have not parted)."""
    for part in parts:
        base_hash.update(part)
        if out_hash is not base_hash:
            out_hash.update(part)
        w.write(part)


def copy_file(base_file: str, path: str, sha256: str, store: ObjectStore, key: str) -> dict:
    """Copy one unmerged base file byte for byte, checking its pinned digest, then read it back."""
    digest = hashlib.sha256()
    chunk = aligned_buffer(CHUNK)
    with open(base_file, "rb", buffering=0) as fh, store.writer(key) as w:
        while n := fh.readinto(chunk):
            digest.update(chunk[:n])
            w.write(chunk[:n])
        if digest.hexdigest() != sha256:
            raise MergeError("merge_base_digest", f"The base file {path}'s bytes do not match its pinned SHA-256.")
        size = w.bytes_written
    readback(store, key, size, sha256, chunk)
    return {"path": path, "bytes": size, "sha256": sha256, "modified": False}


class _Source:
    """Positional reads of one base shard whose size must be the one its header promised."""

    def __init__(self, fh: BinaryIO, job: ShardJob):
        self.fd, self.job = fh.fileno(), job
        size = os.fstat(self.fd).st_size
        if size != job.size:
            code = "merge_source_short" if size < job.size else "merge_source_long"
            raise MergeError(code, f"The base shard {job.path} has {size} bytes; its header says {job.size}.")

    def read(self, start: int, end: int) -> memoryview:
        view = memoryview(bytearray(end - start))
        self.read_into(view, start)
        return view

    def read_into(self, view: memoryview, offset: int) -> None:
        if pread_full(self.fd, view, offset) < len(view):
            raise MergeError("merge_source_short", f"The base shard {self.job.path} became shorter while it was read.")

    def chunks(self, start: int, end: int, buf: memoryview) -> Iterator[memoryview]:
        """Bytes [start, end) as views of `buf`, each valid until the next is yielded."""
        for s in range(start, end, len(buf)):
            part = buf[: min(len(buf), end - s)]
            self.read_into(part, s)
            yield part


def _weight_rows(src: "_Source", target: Target, adapter: np.ndarray, scale: float, buf: memoryview):
    """The base weight `target` read a buffer of whole rows at a time (memory stays at `buf`
    whatever the weight's size), each with the call that merges those rows in place."""
    out_dim, in_dim = target.shape
    a = _factor(adapter, target.a, (target.a.shape[0], in_dim), target.tensor)
    b = _factor(adapter, target.b, (out_dim, target.b.shape[1]), target.tensor)
    if out_dim * in_dim == 0:
        return
    row_bytes = in_dim * 2
    if row_bytes > len(buf):
        buf = aligned_buffer(row_bytes)  # one row wider than the buffer: not a real model's shape
    per = len(buf) // row_bytes
    # A small reused fp32 block stays in cache and costs no fresh pages.
    block = torch.empty(min(max(MIN_ROWS, ROW_BLOCK // in_dim), out_dim), in_dim)
    for r in range(0, out_dim, per):
        n = min(per, out_dim - r)
        view = buf[: n * row_bytes]
        src.read_into(view, target.start + r * row_bytes)
        yield view, lambda view=view, r=r: merge_rows(view, r, b, a, scale, block)


def merge_rows(rows: memoryview, row0: int, b: torch.Tensor, a: torch.Tensor, scale: float, block: torch.Tensor) -> None:
    """`W + B @ A × scale` in fp32, rounded once to bf16, exactly as peft's unsafe merge computes it
    (`get_delta_weight` in fp32, then `weight.data += delta`), written over `rows`: whole bf16 rows
    of W starting at row `row0`. Each delta element is one length-r dot product, but MKL picks its
    kernel (and so the summation order) by the number of rows: blocks of 1-3, 5-7 or 9-11 rows do
    not give the bits of peft's one matmul over the whole weight, blocks of 12 or more do. So a
    short block is computed as the MIN_ROWS rows of B that hold it, and only its own rows are kept."""
    w = torch.frombuffer(rows, dtype=torch.bfloat16).view(-1, a.shape[1])
    out_dim = b.shape[0]
    for s in range(0, w.shape[0], block.shape[0]):
        n = min(block.shape[0], w.shape[0] - s)
        first = row0 + s
        lo = min(first, max(0, out_dim - MIN_ROWS)) if n < MIN_ROWS else first
        m = max(n, min(MIN_ROWS, out_dim))
        delta = torch.matmul(b[lo : lo + m], a, out=block[:m])[first - lo : first - lo + n]
        delta.mul_(scale).add_(w[s : s + n])  # fp32 + exact bf16->fp32, as in `bf16 += fp32`
        w[s : s + n].copy_(delta)  # the one rounding to bf16 (round to nearest even)


def _factor(adapter: np.ndarray, entry, shape: tuple[int, int], tensor: str) -> torch.Tensor:
    if entry.end > adapter.size:
        raise MergeError("merge_factor_unknown", f"The adapter weight {entry.name} for {tensor} is not in the adapter file.")
    if entry.dtype not in _FACTOR_DTYPES:
        raise MergeError("merge_factor_dtype", f"The adapter weight {entry.name} could not be decoded.")
    if tuple(entry.shape) != shape:
        raise MergeError("merge_factor_shape", f"The adapter weight {entry.name} does not fit the base weight {tensor}.")
    raw = bytearray(adapter[entry.start : entry.end])
    if len(raw) != shape[0] * shape[1] * torch.finfo(_FACTOR_DTYPES[entry.dtype]).bits // 8:
        raise MergeError("merge_factor_size", f"The adapter weight {entry.name}'s bytes do not match its header.")
    return torch.frombuffer(raw, dtype=_FACTOR_DTYPES[entry.dtype]).view(shape).float()
