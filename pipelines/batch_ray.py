"""A batch as a Ray Data job: the input file's chat requests -> the output file and the error file.

The flow (`run_batch`, called by the batch controller with Ray initialised):
  read     the driver reads the input file line by line (pipelines/_batch_input.py) and renders
           each runnable prompt with the trainer's template code (pipelines/generate.py); lines
           that cannot run (shape, refused model, unsupported field, prompt over the context)
           become error lines at once;
  generate the requests, grouped by model, go through `map_batches` to a pool of engine actors
           (`settings.batch_engine_actors`, each `settings.batch_engine_resources`), each
           holding the base once with every adapter of the batch, loaded from the batch's staged
           prefixes in the store (`load_engine`); an actor takes `batch_max_rows_in_flight` rows
           per call and decodes them together;
  consume  the driver streams the results, writing each block's output lines to a shard under
           `plan.shard_prefix`; it polls `should_stop()` every half second. On "cancelled" or
           "expired" it writes a stop marker into the shard prefix, which engine actors check
           between decode steps: rows finished by then come back and are kept, the rest return
           at once and become batch_cancelled / batch_expired error lines;
  write    the shards are merged by line number into the output file and the error file through
           the store's atomic writer (input order), and the shards are deleted.

Line ids are derived from the batch id and line number, so a batch run twice writes the same bytes.
Ray Data names the dataset after the batch; its actors are pool members Ray Data names itself.
"""

from __future__ import annotations

import hashlib
import heapq
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from catalog.bases import get_base
from openft.errors import InvalidRequest
from openft.settings import Settings
from pipelines._batch_input import Line, LineError, error_line, not_run_line, output_line, parse_line
from pipelines._items import item_dataset
from pipelines.batch_plan import BatchModel, BatchPlan, LineRefusal
from pipelines.engine import GenRequest, GenResult, SamplingParams
from pipelines.generate import load_engine, prompt_for
from storage.keys import ADAPTER_FILES

STOP_MARKER = "STOP"
_POLL_SECONDS = 0.5
_PREFIX = 17  # "%016x " before each shard line: the line number, for the merge


@dataclass(frozen=True)
class BatchOutcome:
    stopped: str | None
    total: int
    completed: int
    failed: int
    output_bytes: int
    error_bytes: int
    output_sha256: str | None
    error_sha256: str | None
    prompt_tokens: int
    completion_tokens: int
    usage_by_model: dict[str, dict[str, int]]


@dataclass(frozen=True)
class EngineSpec:
    """What an engine actor needs, by value: store coordinates and keys, never a driver path."""

    base_id: str
    kind: str
    model_source: str
    cache_root: str
    store_spec: tuple
    adapters: tuple[tuple[str, str], ...]  # (adapter name, staged prefix)
    max_batch_rows: int
    stop_key: str


class EngineActor:
    """A Ray Data actor: the engine loaded once, then one call per block of requests."""

    def __init__(self, spec: EngineSpec):
        from storage.objects import open_object_store

        self.store = open_object_store(*spec.store_spec)
        adapters = {name: {f: self.store.get_bytes(prefix + f) for f in ADAPTER_FILES} for name, prefix in spec.adapters}
        self.engine = load_engine(get_base(spec.base_id), model_source=spec.model_source, cache_root=spec.cache_root,
                                  adapters=adapters, kind=spec.kind, max_batch_rows=spec.max_batch_rows)  # fmt: skip
        self.stop_key, self.stopped, self.checked = spec.stop_key, False, 0.0

    def should_stop(self) -> bool:
        now = time.monotonic()
        if not self.stopped and now - self.checked >= _POLL_SECONDS:
            self.checked, self.stopped = now, self.store.exists(self.stop_key)
        return self.stopped

    def __call__(self, batch: dict) -> dict:
        requests = []
        for index, raw in zip(batch["index"].to_pylist(), batch["request"].to_pylist()):
            r = orjson.loads(raw)
            params = SamplingParams(r["max_tokens"], r["temperature"], r["top_p"], r["seed"], tuple(r["stop"]))
            requests.append(GenRequest(int(index), r["adapter"], tuple(r["prompt_ids"]), params))
        results = [] if self.should_stop() else self.engine.generate(requests, should_stop=self.should_stop)
        import pyarrow as pa

        return pa.table({"index": pa.array([r.key for r in results], pa.int64()),
                         "result": pa.array([orjson.dumps(_result_dict(r)) for r in results], pa.binary())})  # fmt: skip


def _result_dict(r: GenResult) -> dict:
    return {"text": r.text, "finish_reason": r.finish_reason, "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens}  # fmt: skip


def run_batch(
    plan: BatchPlan,
    *,
    settings: Settings,
    store_spec: tuple,
    should_stop: Callable[[], str | None],
    on_progress: Callable[[int, int], None] | None = None,
) -> BatchOutcome:
    from catalog.model_source import load_tokenizer, parse_model_source
    from storage.objects import open_object_store

    store = open_object_store(*store_spec)
    base = get_base(plan.base_id)
    tokenizer = load_tokenizer(base, parse_model_source(settings.model_source), settings.model_cache_dir)
    store.delete_prefix(plan.shard_prefix)  # a run again starts clean (and without an old stop marker)
    adapter_of = {m.name: (f"m{i}" if m.adapter_prefix else None) for i, m in enumerate(plan.models)}
    order_of = {m.name: i for i, m in enumerate(plan.models)}
    lines: dict[int, Line] = {}
    work: list[tuple[int, int, bytes]] = []  # (model order, line, request)
    errors = _Shards(store, plan.shard_prefix + "errors-")
    for line_no, raw in _iter_lines(store, plan.input_key):
        line = parse_line(raw, line_no)
        lines[line_no] = line
        error = line.error or _model_error(line, plan, order_of)
        request = None
        if error is None:
            request, error = _prepare(line, adapter_of[line.request.model], tokenizer, base)
        if error is not None:
            errors.add(line_no, error_line(plan.batch_id, line, error))
        else:
            work.append((order_of[line.request.model], line_no, request))
    errors.flush()
    failed, completed = errors.count, 0
    if on_progress:
        on_progress(completed, failed)

    outputs = _Shards(store, plan.shard_prefix + "output-")
    usage: dict[str, dict[str, int]] = {}
    done: set[int] = set()
    stopped = should_stop()  # told before any line ran: no engine is started
    if work and stopped is None:
        work.sort()
        spec = EngineSpec(plan.base_id, settings.batch_engine, settings.model_source, str(settings.model_cache_dir),
                          tuple(store_spec), tuple((adapter_of[m.name], m.adapter_prefix) for m in plan.models if m.adapter_prefix),
                          settings.batch_max_rows_in_flight, plan.shard_prefix + STOP_MARKER)  # fmt: skip
        for block in _generate(plan.batch_id, work, spec, settings, store, should_stop):
            if isinstance(block, str):
                stopped = block
                continue
            for index, raw in block:
                line, result = lines[index], orjson.loads(raw)
                model = line.request.model
                outputs.add(index, output_line(plan.batch_id, line, model, plan.created_at, _Result(**result)))
                counts = usage.setdefault(model, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
                counts["requests"] += 1
                counts["prompt_tokens"] += result["prompt_tokens"]
                counts["completion_tokens"] += result["completion_tokens"]
                done.add(index)
            outputs.flush()
            completed = len(done)
            if on_progress:
                on_progress(completed, failed)
    if len(done) < len(work):
        if stopped is None:
            raise RuntimeError(f"batch {plan.batch_id}: the engine returned {len(done)} of {len(work)} results unasked")
        for _, line_no, _ in work:
            if line_no not in done:
                errors.add(line_no, not_run_line(plan.batch_id, lines[line_no], stopped))
        errors.flush()
    out_bytes, out_sha = _assemble(store, outputs.keys, plan.output_key)
    err_bytes, err_sha = _assemble(store, errors.keys, plan.error_key)
    store.delete_prefix(plan.shard_prefix)
    return BatchOutcome(
        stopped=stopped, total=len(lines), completed=len(done), failed=len(lines) - len(done),
        output_bytes=out_bytes, error_bytes=err_bytes, output_sha256=out_sha, error_sha256=err_sha,
        prompt_tokens=sum(u["prompt_tokens"] for u in usage.values()),
        completion_tokens=sum(u["completion_tokens"] for u in usage.values()), usage_by_model=usage,
    )  # fmt: skip


@dataclass(frozen=True)
class _Result:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _model_error(line: Line, plan: BatchPlan, order_of: dict) -> LineError | None:
    model = line.request.model
    if model in order_of:
        return None
    refusal = plan.refused_models.get(model)
    if refusal is not None:
        return LineError(refusal.status_code, refusal.code, refusal.message, "body.model")
    return LineError(404, "model_not_found", "body.model names no model this batch can run.", "body.model")


def _prepare(line: Line, adapter: str | None, tokenizer, base) -> tuple[bytes | None, LineError | None]:
    r = line.request
    try:
        ids, max_tokens = prompt_for(r.messages, r.max_tokens, tokenizer, base, line.line_no, where=f"line {line.line_no}: ")
    except InvalidRequest as exc:
        return None, LineError(400, exc.code, exc.message, exc.param)
    request = {"adapter": adapter, "prompt_ids": ids, "max_tokens": max_tokens, "temperature": r.temperature,
               "top_p": r.top_p, "seed": r.seed, "stop": list(r.stop)}  # fmt: skip
    return orjson.dumps(request), None


def _generate(batch_id: str, work: list, spec: EngineSpec, settings: Settings, store, should_stop):
    """Yield each result block as [(line, result json)], and the stop reason once when told to stop."""
    import ray

    rows = settings.batch_max_rows_in_flight
    items = [{"index": line_no, "request": request} for _, line_no, request in work]
    ds = item_dataset(items, name=batch_id, blocks=-(-len(items) // rows))
    resources = dict(settings.batch_engine_resources)
    num_cpus, num_gpus = resources.pop("CPU", 0), resources.pop("GPU", 0)
    ds = ds.map_batches(
        EngineActor, fn_constructor_args=(spec,), batch_size=rows, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=settings.batch_engine_actors, max_tasks_in_flight_per_actor=1),
        num_cpus=num_cpus, num_gpus=num_gpus or None, resources=resources or None,
    )  # fmt: skip
    ds.set_name(batch_id)
    results: queue.Queue = queue.Queue()
    failure: list[BaseException] = []

    def consume() -> None:
        try:
            for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                results.put(list(zip(block["index"].to_pylist(), block["result"].to_pylist())))
        except BaseException as exc:  # re-raised on the driver's thread below
            failure.append(exc)
        finally:
            results.put(None)

    consumer = threading.Thread(target=consume, name=f"{batch_id}-results", daemon=True)
    consumer.start()
    stopped = None
    while True:
        if stopped is None:
            stopped = should_stop()
            if stopped is not None:
                store.put_bytes(spec.stop_key, stopped.encode())
                yield stopped
        try:
            block = results.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if block is None:
            break
        yield block
    consumer.join()
    if failure:
        raise failure[0]


def _iter_lines(store, key: str):
    """(line number, bytes) of each non-blank line, read in chunks."""
    rest, line_no = b"", 0
    for chunk in store.iter_chunks(key):
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            line_no += 1
            if raw.strip():
                yield line_no, raw
    if rest.strip():
        yield line_no + 1, rest


class _Shards:
    """Lines buffered and written as sorted shards, each line prefixed with its line number."""

    def __init__(self, store, prefix: str):
        self.store, self.prefix = store, prefix
        self.keys: list[str] = []
        self.pending: list[tuple[int, bytes]] = []
        self.count = 0

    def add(self, line_no: int, line: dict) -> None:
        self.pending.append((line_no, orjson.dumps(line)))
        self.count += 1

    def flush(self) -> None:
        if self.pending:
            key = f"{self.prefix}{len(self.keys):06d}.jsonl"
            self.store.put_bytes(key, b"".join(b"%016x %s\n" % (n, data) for n, data in sorted(self.pending)))
            self.keys.append(key)
            self.pending = []


def _assemble(store, shard_keys: list[str], key: str) -> tuple[int, str | None]:
    """Merge the shards by line number into `key` (atomic); (bytes, sha256), (0, None) when empty."""
    if not shard_keys:
        return 0, None
    streams = [_shard_lines(store, k) for k in shard_keys]
    digest, size = hashlib.sha256(), 0
    with store.writer(key) as out:
        for line in heapq.merge(*streams):
            data = line[_PREFIX:]
            out.write(data)
            digest.update(data)
            size += len(data)
    return size, digest.hexdigest()


def _shard_lines(store, key: str):
    rest = b""
    for chunk in store.iter_chunks(key):
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            yield part + b"\n"
