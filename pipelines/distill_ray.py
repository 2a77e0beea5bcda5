"""Distillation as a Ray Data job: a batch's stored requests and results -> train.jsonl and eval.jsonl.

The flow, with the rules of `pipelines/distill.py`:
  read    both files cut into byte ranges at line starts (`validate_ray.block_ranges`); one task
          per range parses its lines (`parse_request` / `parse_result`) into Arrow rows that
          carry `order` = range index << 32 | line within the range, so file order survives;
  join    a range-partitioned shuffle on custom_id (`sort("custom_id")`) puts every request and
          result line with one custom_id in the same block; one task per block pairs them,
          finds duplicates, decides each result (`decide`, `is_eval`) and writes its kept rows,
          sorted and prefixed with their order, to shards under `<out_prefix>/shards/`;
  write   the driver merges the shards by order prefix (a streaming k-way merge) into
          `<out_prefix>/train.jsonl` and `<out_prefix>/eval.jsonl` through the store's atomic
          writer, then deletes the shards.
File-level rules (one format per file, unique custom_ids, well-formed lines) are decided on the
driver from each block's earliest finding, so the error raised is the one `distill_local` raises.

Memory: a read task holds one range (`block_bytes`) and its parsed rows. The shuffle holds the
parsed rows of both files (about their size: answers, converted prompts) in Ray's object store,
which spills to disk beyond its capacity; a join task holds one key range, about
(results + requests) / number of ranges. The driver holds one 256 KiB chunk per shard.

Why a sort and not `Dataset.join` or `repartition(keys=...)`: the join needs polars, and Ray
Data's hash shuffle runs its map tasks in workers with their own runtime env; on a small node
those and the default workers evict each other from the idle pool, so every job restarted its
workers (16 s for 4,000 lines on 2 CPUs, against under 1 s with the sort). The sort's shuffle
runs on the default workers. Like `GroupedData.map_groups`, the join relies on the sort never
splitting one key's rows over two output blocks.
"""

from __future__ import annotations

import heapq
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import orjson
import pyarrow as pa

from pipelines._batch_lines import BadLine, Prompt, Unconvertible, parse_request, parse_result
from pipelines._items import item_dataset
from pipelines.distill import (
    REASONS,
    REQUESTS,
    RESULTS,
    DistillOptions,
    bad_line,
    decide,
    duplicate_custom_id,
    empty_file,
    is_eval,
    iter_lines,
    mixed_formats,
)
from pipelines.validate_ray import block_ranges
from storage.objects import ObjectStore, open_object_store

__all__ = ["DistillResult", "build_distill"]

_SIDES = (RESULTS, REQUESTS)  # the index of each file in the `side` column
_INVALID, _DUPLICATE = "invalid_file_format", "duplicate_custom_id"
_SCHEMA = pa.schema(
    [
        ("side", pa.int8()),
        ("order", pa.int64()),
        ("custom_id", pa.string()),
        ("fmt", pa.string()),
        ("code", pa.string()),  # "": usable; a result's drop reason; "not_convertible"; _INVALID
        ("text", pa.string()),  # a result's answer, a request's prefill or why it is unconvertible, a BadLine's detail
        ("prompt", pa.binary()),  # a request's messages as JSON
    ]
)
_PREFIX = 17  # "%016x " before each shard line
_MERGE_CHUNK = 256 << 10


@dataclass
class DistillResult:
    train_key: str
    eval_key: str
    train_rows: int
    eval_rows: int
    dropped: dict[str, int]  # every key of REASONS, 0 when none


def _parse_ranges(batch: dict[str, Any], *, store_spec: tuple, keys: tuple[str, str], keep_truncated: bool) -> pa.Table:
    store = open_object_store(*store_spec)
    cols: dict[str, list] = {name: [] for name in _SCHEMA.names}

    def add(side: int, order: int, custom_id: str, fmt: str, code: str, text: str | None, prompt: bytes | None):
        for name, value in zip(_SCHEMA.names, (side, order, custom_id, fmt, code, text, prompt)):
            cols[name].append(value)

    for side, index, start, stop in zip(batch["side"], batch["index"], batch["start"], batch["stop"]):
        side, base = int(side), int(index) << 32
        data = store.read_range(keys[side], int(start), int(stop))
        for local, line in enumerate(iter_lines([data]), 1):
            try:
                if side == 0:
                    custom_id, fmt, answer, reason = parse_result(line, keep_truncated)
                    add(side, base | local, custom_id, fmt, reason, answer, None)
                    continue
                custom_id, fmt, prompt = parse_request(line)
            except BadLine as err:
                add(side, base | local, "", "", _INVALID, err.detail, None)
                continue
            if isinstance(prompt, Unconvertible):
                add(side, base | local, custom_id, fmt, "not_convertible", prompt.why, None)
            else:
                add(side, base | local, custom_id, fmt, "", prompt.prefill, prompt.messages_json)
    return pa.Table.from_pydict(cols, schema=_SCHEMA)


class _Findings:
    """The earliest format of each kind and the earliest refused line, per file, in one block."""

    def __init__(self) -> None:
        self.formats: list[dict[str, int]] = [{}, {}]
        self.errors: list[list | None] = [None, None]  # [order, rank, code, detail]

    def error(self, side: int, order: int, code: str, detail: str = "") -> None:
        # At the same line a mixed format (rank 0, found on the driver) comes before a duplicate.
        found = [order, 1 if code == _DUPLICATE else 0, code, detail]
        if self.errors[side] is None or found[:2] < self.errors[side][:2]:
            self.errors[side] = found


def _join_partition(table: pa.Table, *, store_spec: tuple, shard_prefix: str, options: DistillOptions) -> pa.Table:
    c = table.to_pydict()
    findings = _Findings()
    prompts: dict[str, Prompt | Unconvertible] = {}
    results: list[tuple[int, str, str, str]] = []
    seen: tuple[set[str], set[str]] = (set(), set())
    for i in sorted(range(len(c["order"])), key=c["order"].__getitem__):
        side, order, custom_id, code = c["side"][i], c["order"][i], c["custom_id"][i], c["code"][i]
        if code == _INVALID:
            findings.error(side, order, code, c["text"][i])
            continue
        findings.formats[side].setdefault(c["fmt"][i], order)
        if custom_id in seen[side]:
            findings.error(side, order, _DUPLICATE)
            continue
        seen[side].add(custom_id)
        if side == 0:
            results.append((order, custom_id, c["text"][i], code))
        elif code:
            prompts[custom_id] = Unconvertible(c["text"][i])
        else:
            prompts[custom_id] = Prompt(c["prompt"][i], c["text"][i])

    counts = dict.fromkeys(("train", "eval") + REASONS, 0)
    shards: dict[str, list[bytes]] = {"train": [], "eval": []}
    for order, custom_id, answer, reason in results:
        decision = decide(prompts.get(custom_id), answer, reason, options)
        split = decision.reason or ("eval" if is_eval(custom_id, options) else "train")
        counts[split] += 1
        if not decision.reason:
            shards[split].append(b"%016x %s\n" % (order, decision.row))
    store = open_object_store(*store_spec)
    for split, lines in shards.items():
        if lines:
            with store.writer(f"{shard_prefix}{split}-{uuid.uuid4().hex}.jsonl") as w:
                w.write(b"".join(lines))
    stats = {"counts": counts, "formats": findings.formats, "errors": findings.errors}
    return pa.table({"stats": [orjson.dumps(stats)]})


def _first_problem(blocks: list[dict], side: int) -> list | None:
    """The file's earliest refused line as [order, rank, code, detail], or None."""
    firsts: dict[str, int] = {}
    for block in blocks:
        for fmt, order in block["formats"][side].items():
            firsts[fmt] = min(order, firsts.get(fmt, order))
    found = [b["errors"][side] for b in blocks if b["errors"][side] is not None]
    if len(firsts) > 1:
        first = min(firsts, key=firsts.__getitem__)
        other = next(f for f in firsts if f != first)
        found.append([firsts[other], 0, "mixed_formats", first])
    return min(found, key=lambda f: f[:2]) if found else None


def _raise(store: ObjectStore, key: str, ranges: list[tuple[int, int]], side: int, problem: list) -> None:
    order, _, code, detail = problem
    start = ranges[order >> 32][0]
    line = sum(chunk.count(b"\n") for chunk in _chunks(store, key, start)) + (order & 0xFFFFFFFF)
    param = _SIDES[side]
    if code == _INVALID:
        raise bad_line(BadLine(detail), param, line)
    if code == _DUPLICATE:
        raise duplicate_custom_id(param, line)
    other = "openai" if detail == "anthropic" else "anthropic"
    raise mixed_formats(param, line, other, detail)


def _chunks(store: ObjectStore, key: str, end: int) -> Iterator[bytes]:
    for offset in range(0, end, 4 << 20):
        yield store.read_range(key, offset, min(offset + (4 << 20), end))


def _merge_shards(store: ObjectStore, shard_keys: list[str], key: str) -> None:
    """Write the shards' lines to `key` in order of their prefix, without the prefix."""
    streams = [iter_lines(store.iter_chunks(k, _MERGE_CHUNK)) for k in shard_keys]
    with store.writer(key) as w:
        buf: list[bytes] = []
        size = 0
        # The prefix is fixed-width hex, so byte order of the lines is the order of the rows.
        for line in heapq.merge(*streams):
            buf.append(line[_PREFIX:] + b"\n")
            size += len(line)
            if size >= _MERGE_CHUNK * 4:
                w.write(b"".join(buf))
                buf, size = [], 0
        w.write(b"".join(buf))


def build_distill(
    store_spec: tuple,
    results_key: str,
    requests_key: str,
    out_prefix: str,
    options: DistillOptions,
    *,
    block_bytes: int = 8 << 20,
    max_cpus: float | None = None,
    name: str | None = None,
) -> DistillResult:
    """Distill stored `results_key` with `requests_key` into `<out_prefix>/{train,eval}.jsonl`.

    Raises DistillError (results_file checked first). The files are read in ranges of about
    `block_bytes`, and the join runs in as many key ranges; `max_cpus` caps the CPUs this job's
    tasks use; `name` names the Ray Data dataset (`<file id> distill`). Ray must be initialised.
    """
    from ray.data.context import ShuffleStrategy  # ray.data when a distill runs, not when the API imports this

    store = open_object_store(*store_spec)
    keys = (results_key, requests_key)
    shard_prefix = f"{out_prefix}/shards/"
    sizes = [store.size(k) for k in keys]
    ranges = [block_ranges(store, k, 0, size, block_bytes) for k, size in zip(keys, sizes)]
    if not ranges[0]:
        raise empty_file(RESULTS)
    items = [
        {"side": side, "index": i, "start": s, "stop": e} for side in (0, 1) for i, (s, e) in enumerate(ranges[side])
    ]
    store.delete_prefix(shard_prefix)  # what a crashed run left
    try:
        # Reservation off (pipelines/_items.py): the read and the join run one after the other around the shuffle.
        ds = item_dataset(items, name=name)
        ds.context.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        if max_cpus is not None:
            ds.context.execution_options.resource_limits = ds.context.execution_options.resource_limits.copy(
                cpu=max_cpus
            )
        fn_kwargs = {"store_spec": tuple(store_spec), "keys": keys, "keep_truncated": options.keep_truncated}
        parsed = ds.map_batches(_parse_ranges, batch_size=1, fn_kwargs=fn_kwargs)
        joined = parsed.sort("custom_id").map_batches(
            _join_partition,
            batch_size=None,
            batch_format="pyarrow",
            fn_kwargs={"store_spec": tuple(store_spec), "shard_prefix": shard_prefix, "options": options},
        )
        blocks = [orjson.loads(row["stats"]) for row in joined.take_all()]
        for side in (0, 1):
            problem = _first_problem(blocks, side)
            if problem is not None:
                _raise(store, keys[side], ranges[side], side, problem)
            if side == 1 and not ranges[1]:
                raise empty_file(REQUESTS)
        counts = {name: sum(b["counts"][name] for b in blocks) for name in blocks[0]["counts"]} if blocks else {}
        out = {}
        for split in ("train", "eval"):
            out[split] = f"{out_prefix}/{split}.jsonl"
            _merge_shards(store, list(store.list(f"{shard_prefix}{split}-")), out[split])
    finally:
        store.delete_prefix(shard_prefix)
    return DistillResult(
        train_key=out["train"],
        eval_key=out["eval"],
        train_rows=counts.get("train", 0),
        eval_rows=counts.get("eval", 0),
        dropped={r: counts.get(r, 0) for r in REASONS},
    )
