"""The per-shard merge task: stream one base shard into the export, adding `B·A × scale` to its
adapted weights, and check every byte on the way.

Third step of the flow: `merge/run.py` runs `merge_shard` as one Ray task per shard. The output's
header is the base's header byte for byte (a bf16 weight stays bf16, so no size or offset changes),
written first; then each tensor's bytes in file order: unadapted ones copied in chunks, adapted
ones merged in fp32 and rounded once to bf16, a block of rows at a time. Memory stays at one
weight plus a chunk, whatever the shard's size. The base's bytes are hashed as they are read and
checked against the pinned SHA-256 before the atomic writer publishes the shard; then the stored
shard is read back and its digest compared.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from typing import BinaryIO

import numpy as np
import torch

from merge.errors import MergeError
from merge.export import readback
from merge.plan import ShardJob, Target
from storage.objects import ObjectStore, Writer

CHUNK = 16 << 20
ROW_BLOCK = 1 << 20  # fp32 elements of a weight merged at once (4 MiB)
_FACTOR_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def merge_shard(job: ShardJob, base_file: str, store: ObjectStore, key: str, adapter: np.ndarray, scale: float) -> dict:
    """Write the merged `job` shard under `key` and return its `{path, bytes, sha256, modified}`.

    `adapter` is the whole adapter file's bytes (uint8); the targets' factor offsets index into it.
    """
    base_hash = hashlib.sha256()
    # Input and output are the same bytes up to the first adapted weight, so one digest serves both
    # until there and is forked (`copy()`: SHA-256's running state) where they part; an unadapted
    # shard never forks. The bytes before it (an embedding, say) are hashed once, not twice.
    out_hash = base_hash
    with open(base_file, "rb") as fh, _Source(fh, job) as src:
        if hashlib.sha256(src.view(0, job.data_start)).hexdigest() != job.header_sha256:
            raise MergeError("merge_source_header", f"The base shard {job.path}'s header changed while it was read.")
        scratch = bytearray(max((t.end - t.start for t in job.targets), default=0))
        with store.writer(key) as w:
            pos = 0
            for target in job.targets:
                src.copy(pos, target.start, w, base_hash, out_hash)
                if out_hash is base_hash:
                    out_hash = base_hash.copy()
                n = target.end - target.start
                scratch[:n] = src.view(target.start, target.end)
                src.release(target.start, target.end)
                weight = memoryview(scratch)[:n]
                base_hash.update(weight)
                merge_weight(weight, target, adapter, scale)
                out_hash.update(weight)
                w.write(weight)
                pos = target.end
            src.copy(pos, job.size, w, base_hash, out_hash)
            if base_hash.hexdigest() != job.sha256:
                raise MergeError("merge_base_digest", f"The base file {job.path}'s bytes do not match its pinned SHA-256.")
            if w.bytes_written != job.size:
                raise MergeError("merge_output_size", f"The merged {job.path} has {w.bytes_written} bytes, the base's {job.size}.")
    digest = out_hash.hexdigest()
    readback(store, key, job.size, digest)
    return {"path": job.path, "bytes": job.size, "sha256": digest, "modified": bool(job.targets)}


def copy_file(base_file: str, path: str, sha256: str, store: ObjectStore, key: str) -> dict:
    """Copy one unmerged base file byte for byte, checking its pinned digest, then read it back."""
    digest = hashlib.sha256()
    with open(base_file, "rb") as fh, store.writer(key) as w:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            w.write(chunk)
        if digest.hexdigest() != sha256:
            raise MergeError("merge_base_digest", f"The base file {path}'s bytes do not match its pinned SHA-256.")
        size = w.bytes_written
    readback(store, key, size, sha256)
    return {"path": path, "bytes": size, "sha256": sha256, "modified": False}


class _Source:
    """The base shard memory-mapped read-only. Pages already copied out are dropped from this
    process (they stay in the page cache), so resident memory stays at a chunk, not the shard."""

    def __init__(self, fh: BinaryIO, job: ShardJob):
        self.job = job
        size = os.fstat(fh.fileno()).st_size
        if size != job.size:
            code = "merge_source_short" if size < job.size else "merge_source_long"
            raise MergeError(code, f"The base shard {job.path} has {size} bytes; its header says {job.size}.")
        self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

    def __enter__(self) -> "_Source":
        return self

    def __exit__(self, *exc) -> None:
        self.map.close()

    def view(self, start: int, end: int) -> memoryview:
        return memoryview(self.map)[start:end]

    def release(self, start: int, end: int) -> None:
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            self.map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def copy(self, start: int, end: int, w: Writer, base_hash, out_hash) -> None:
        for s in range(start, end, CHUNK):
            e = min(s + CHUNK, end)
            with self.view(s, e) as chunk:
                base_hash.update(chunk)
                if out_hash is not base_hash:
                    out_hash.update(chunk)
                w.write(chunk)
            self.release(s, e)


def merge_weight(weight: bytearray | memoryview, target: Target, adapter: np.ndarray, scale: float) -> None:
    """`W + B @ A × scale` in fp32, rounded once to bf16, exactly as peft's unsafe merge computes it
    (`get_delta_weight` in fp32, then `weight.data += delta`), written over `weight`'s buffer."""
    out_dim, in_dim = target.shape
    if out_dim * in_dim == 0:
        return
    a = _factor(adapter, target.a, (target.a.shape[0], in_dim), target.tensor)
    b = _factor(adapter, target.b, (out_dim, target.b.shape[1]), target.tensor)
    w = torch.frombuffer(weight, dtype=torch.bfloat16).view(out_dim, in_dim)
    # Row blocks give the same bits as one matmul (each element is one length-r dot product); a
    # small reused fp32 block stays in cache and costs no fresh pages.
    rows = max(1, ROW_BLOCK // max(1, in_dim))
    block = torch.empty(min(rows, out_dim), in_dim)
    for s in range(0, out_dim, rows):
        n = min(rows, out_dim - s)
        delta = torch.matmul(b[s : s + n], a, out=block[:n])
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
