"""Validation of a stored file's lines as a Ray Data job, for uploads too big to check inline.

The upload checks the first part of a large file as it streams (`StreamingValidator` with
`full_check_bytes`) and hands the rest here: the file is cut into byte ranges that start at line
starts, one Ray Data task checks each range with the same `scan_lines` as the inline path, and
the driver combines the per-range results in file order with `Tally`, so the error raised is the
first invalid line of the whole file, numbered as the streaming validator would number it.

The ranges split the part to check evenly over the cluster's CPUs (up to `block_bytes` each): a
Ray Data task has a fixed cost, and fixed 8 MiB blocks on a 2-CPU node ran four waves of small
tasks for a 64 MiB upload, which made the upload path 0.43x the bare parse instead of 0.55x
(`bench/validate.py --range-mib-max 8` against the default).
"""

from __future__ import annotations

from typing import Any

import ray

from openft.limits import FINE_TUNE_FILE_BYTES
from pipelines._items import item_dataset
from pipelines._rows import FileValidationError
from pipelines.validate import BlockResult, FileStats, Tally, file_too_large, scan_lines
from storage.objects import ObjectStore, open_object_store

# Bytes read past each nominal block boundary to find the next line start. A boundary with no
# newline in its window is dropped and its range runs on to the next one.
_BOUNDARY_WINDOW = 64 << 10
MIN_RANGE_BYTES = 1 << 20  # below this, a task's fixed cost outweighs the parallelism


def block_ranges(store: ObjectStore, key: str, start: int, end: int, block_bytes: int) -> list[tuple[int, int]]:
    """Ranges [s, e) covering [start, end), each beginning at a line start (`start` must be one)."""
    if start >= end:
        return []
    cuts = [start]
    for nominal in range(start + block_bytes, end, block_bytes):
        if nominal <= cuts[-1]:
            continue
        window = store.read_range(key, nominal - 1, min(nominal - 1 + _BOUNDARY_WINDOW, end))
        newline = window.find(b"\n")
        if newline >= 0 and nominal + newline < end:
            cuts.append(nominal + newline)
    return list(zip(cuts, cuts[1:] + [end]))


def even_range_bytes(span: int, cap: int) -> int:
    """Range size that gives each of the cluster's CPUs one range of `span` bytes, within
    [MIN_RANGE_BYTES, cap] (a cap below the minimum wins: tests use tiny ranges on purpose)."""
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    return min(cap, max(MIN_RANGE_BYTES, -(-span // cpus)))


def _scan_range(item: dict[str, Any], *, store_spec: tuple, key: str, purpose: str) -> dict[str, Any]:
    start, stop = item["start"], item["stop"]
    data = open_object_store(*store_spec).read_range(key, start, stop)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # what follows the range's last newline, not an empty line
    block = scan_lines(lines, purpose, len(data))
    return {
        "index": item["index"],
        "lines": block.lines,
        "row_kind": block.stats.row_kind or "",
        "rows": block.stats.rows,
        "messages": block.stats.messages,
        "content_bytes": block.stats.content_bytes,
        "bytes": block.stats.bytes,
        "other_kind_line": block.other_kind_line,
        "error_line": block.error_line,
        "error_code": block.error_code,
        "error_detail": block.error_detail,
        "other_kind": block.other_kind,
    }


def _block(row: dict[str, Any]) -> BlockResult:
    stats = FileStats(row["row_kind"] or None, row["rows"], row["messages"], row["content_bytes"], row["bytes"])
    return BlockResult(
        row["lines"], stats, row["other_kind_line"], row["error_line"], row["error_code"], row["error_detail"],
        row["other_kind"],
    )


def build_validation(
    store_spec: tuple,
    key: str,
    purpose: str,
    *,
    start_offset: int = 0,
    start_line: int = 1,
    block_bytes: int = 64 << 20,
    head_stats: FileStats | None = None,
    max_bytes: int = FINE_TUNE_FILE_BYTES,
    name: str | None = None,
) -> FileStats:
    """Check the lines of stored object `key` from `start_offset` (line `start_line`) to its end.

    `head_stats` are the statistics of the part before `start_offset`; the result covers the
    whole file. `block_bytes` caps one task's range. Raises FileValidationError with the first
    invalid line. `name` names the Ray Data dataset (`<file id> validate`). Ray must be initialised.
    """
    store = open_object_store(*store_spec)
    size = store.size(key)
    if size > max_bytes:
        raise file_too_large(max_bytes)
    ranges = block_ranges(store, key, start_offset, size, even_range_bytes(size - start_offset, block_bytes))
    tally = Tally(head_stats, start_line)
    if ranges:
        items = [{"index": i, "start": s, "stop": e} for i, (s, e) in enumerate(ranges)]
        ds = item_dataset(items, name=name)
        fn_kwargs = {"store_spec": tuple(store_spec), "key": key, "purpose": purpose}
        rows = ds.map(_scan_range, fn_kwargs=fn_kwargs).take_all()
        for row in sorted(rows, key=lambda r: r["index"]):
            tally.add(_block(row))
    return tally.finish()


__all__ = ["FileValidationError", "block_ranges", "build_validation", "even_range_bytes"]
