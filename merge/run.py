"""Merging a LoRA adapter into its base: the request, the checks before any work, and the run.

`preflight` makes the refusals of the reference's first table and validates the adapter from its
config and safetensors header alone (fast; no weights read). `run_merge` then reads the adapter
once (checking its digests), resolves the base at its pinned revision, plans the merge from the
base's index and headers (`merge/plan.py`), runs one Ray task per base shard (`merge/shard.py`;
a task on another node resolves the base in that node's own model cache), copies the other base
files byte for byte, and writes the licence files, the index, NOTICE and
`gridline_merge.json` last (`merge/export.py`). Every stored file is read back and compared; if
anything fails after writing began, the export prefix is deleted. The output is a pure function
of the adapter and the pinned base, so re-running a merge overwrites the export with the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from catalog.bases import BASES, BaseModelSpec
from catalog.model_source import parse_model_source, resolve_base_dir
from merge.adapter import LoraAdapter, validate_adapter
from merge.errors import MergeError, MergeStopped
from merge.export import MANIFEST, NOTICE, licence_sources, manifest, manifest_bytes, notice_text, put_checked, reviewed_licence
from merge.plan import INDEX, MergePlan, ShardJob, build_plan, pinned_digests
from storage.leases import lost_by_ray
from storage.objects import ObjectNotFound, ObjectStore, check_prefix, open_object_store

ADAPTER_MODEL = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
CANCEL_GRACE_S = 10.0


@dataclass(frozen=True)
class MergeRequest:
    base_id: str
    model_source: str  # Settings.model_source: hub | dir:/path | standin
    cache_root: str  # where bases (and operator-pinned digests, merge/plan.py) are cached
    store_spec: tuple  # ObjectStore.spec() of the store holding the adapter and the export
    adapter_prefix: str  # <prefix>/adapter_model.safetensors and <prefix>/adapter_config.json
    export_prefix: str
    deadline_s: float = 900.0
    adapter_sha256: dict[str, str] | None = None  # expected digests of the two adapter files
    model: str = ""  # the `ft:` model merged: names the shard tasks on the Ray dashboard


@dataclass
class MergeResult:
    files: list[dict]  # every stored file: {path, bytes, sha256, modified}, gridline_merge.json included
    manifest: dict  # gridline_merge.json's content


def preflight(req: MergeRequest, store: ObjectStore | None = None) -> None:
    """Raise MergeError if the merge would be refused or the adapter cannot be merged; reads only
    adapter_config.json and the adapter's safetensors header."""
    store = store or open_object_store(*req.store_spec)
    base = _known_base(req.base_id)
    reviewed_licence(base)
    config = _adapter_file(store, req, ADAPTER_CONFIG)
    key = f"{req.adapter_prefix.rstrip('/')}/{ADAPTER_MODEL}"
    try:
        size = store.size(key)
        validate_adapter(config, lambda s, e: store.read_range(key, s, e), size, base)
    except (ObjectNotFound, OSError) as exc:
        raise MergeError("merge_adapter_unavailable", "The adapter's files could not be read.") from exc


def run_merge(req: MergeRequest, store: ObjectStore | None = None,
              should_stop: Callable[[], bool] = lambda: False) -> MergeResult:
    """Merge the adapter into its base and store the export under `req.export_prefix`.

    `store` defaults to `open_object_store(*req.store_spec)`; the shard tasks receive it pickled.
    Needs a running Ray (the caller's). Raises MergeError; a process Ray lost under it is
    `merge_interrupted` (queued again), any other failure `merge_failed`.
    `should_stop()` is polled with the deadline: True stops the merge (MergeStopped), its shard
    tasks cancelled and what it wrote left in place.
    """
    deadline = _Deadline(time.monotonic() + req.deadline_s, should_stop)
    store = store or open_object_store(*req.store_spec)
    prefix = _export_prefix(req.export_prefix)
    writing = False
    try:
        adapter, adapter_bytes, adapter_sha256 = _load_adapter(req, store)
        base_dir = _base_dir(adapter.base, req)
        pinned = pinned_digests(adapter.base, parse_model_source(req.model_source), base_dir, Path(req.cache_root))
        plan = build_plan(adapter, base_dir, pinned)
        licences, attribution = reviewed_licence(adapter.base)
        extra_licences = licence_sources(licences, base_dir, set(pinned))
        writing = True
        return _write(req, store, prefix, deadline, plan, adapter, adapter_bytes, adapter_sha256, base_dir, extra_licences, attribution)
    except MergeStopped:
        raise
    except MergeError:
        if writing:
            store.delete_prefix(prefix + "/")
        raise
    except Exception as exc:
        if writing:
            store.delete_prefix(prefix + "/")
        if lost_by_ray(exc):  # a shard's worker or node died: not the merge's fault, so it runs again
            raise MergeError("merge_interrupted", "A process the merge ran on was lost; it runs again.") from exc
        raise MergeError("merge_failed", f"The merge failed ({type(exc).__name__}).") from exc


def _write(req, store, prefix, deadline, plan: MergePlan, adapter: LoraAdapter, adapter_bytes, adapter_sha256,
           base_dir: Path, extra_licences: dict[str, Path], attribution: str) -> MergeResult:  # fmt: skip
    # merge.shard (torch) is imported by the merge's own tasks, not by the API that imports this module.
    from merge.shard import copy_file

    adapter_ref = ray.put(np.frombuffer(adapter_bytes, dtype=np.uint8))
    # Named for the Ray dashboard: which model (else base) and shard a running task is merging.
    tasks = [
        _merge_shard.options(name=f"merge {req.model or adapter.base.id} {job.path}").remote(
            req, job, store, f"{prefix}/{job.path}", adapter_ref, adapter.scale
        )
        for job in plan.shards
    ]
    try:
        files = []
        own_notice = None
        # The index is written after the shards it names; a base NOTICE is folded into ours.
        for path, sha256 in plan.files:
            _check_deadline(deadline)
            if path == NOTICE:
                own_notice = _checked_text(base_dir / path, sha256)
            elif path != INDEX:
                files.append(copy_file(str(base_dir / path), path, sha256, store, f"{prefix}/{path}"))
        files += _wait(tasks, deadline)
    except BaseException:
        _cancel(tasks)
        raise
    if INDEX in dict(plan.files):
        files.append(copy_file(str(base_dir / INDEX), INDEX, dict(plan.files)[INDEX], store, f"{prefix}/{INDEX}"))
    for name, source in extra_licences.items():
        files.append(put_checked(store, f"{prefix}/{name}", name, source.read_bytes()))
    added = [*extra_licences, *([] if own_notice is not None else [NOTICE]), MANIFEST]
    notice = put_checked(store, f"{prefix}/{NOTICE}", NOTICE, notice_text(plan, adapter, added, attribution, own_notice).encode())
    files.append({**notice, "modified": own_notice is not None})
    _check_deadline(deadline)
    doc = manifest(plan, adapter, adapter_sha256, files, added)
    files.append(put_checked(store, f"{prefix}/{MANIFEST}", MANIFEST, manifest_bytes(doc)))
    return MergeResult(files=sorted(files, key=lambda f: f["path"]), manifest=doc)


@ray.remote(num_cpus=1, max_retries=0)
def _merge_shard(req: MergeRequest, job: ShardJob, store: ObjectStore, key: str, adapter: np.ndarray, scale: float) -> dict:
    """One shard task. It may run on another node than the driver, so it resolves the base in its
    own node's model cache (`req`'s model source and cache root: settings, the same on every node),
    never at the driver's path; `merge_shard` checks the shard's pinned SHA-256 as it reads, so a
    node whose copy differs fails the merge instead of exporting other weights."""
    from merge.shard import merge_shard

    base_dir = _base_dir(_known_base(req.base_id), req)
    return merge_shard(job, str(base_dir / job.path), store, key, adapter, scale)


def _wait(tasks: list, deadline: _Deadline) -> list[dict]:
    """The shard tasks' results; the first failure (or the deadline, or a stop) cancels the rest."""
    pending, results = list(tasks), []
    while pending:
        _check_deadline(deadline)
        # Woken at least every second: a stop is seen within one.
        ready, pending = ray.wait(pending, num_returns=1, timeout=min(1.0, max(0.0, deadline.at - time.monotonic())))
        for ref in ready:
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, MergeError):
                    raise MergeError(exc.cause.code, exc.cause.message) from exc
                raise MergeError("merge_failed", f"A shard task failed ({type(exc.cause).__name__}).") from exc
    return results


def _cancel(tasks: list) -> None:
    """Stop the shard tasks and wait for them to end, so none publishes into a deleted export.

    Only the tasks still running after a grace are cancelled: Ray 2.60 aborts the owner's whole
    process (this merge's driver: the job controller, or a test's pytest worker) when `ray.cancel`
    meets a task whose result is arriving at that moment (task_manager.cc, "Tried to complete task
    that was not pending"; seen once in make test, where the stand-ins' shards are small).
    A shard that ends within the grace needs no cancel; one still queued or running after it is
    most likely far from its end, where the cancel has no result to race."""
    _, left = ray.wait(tasks, num_returns=len(tasks), timeout=CANCEL_GRACE_S)
    for ref in left:
        ray.cancel(ref)  # a KeyboardInterrupt in the task: its atomic writer discards the part file
    _, left = ray.wait(left, num_returns=len(left), timeout=CANCEL_GRACE_S)
    for ref in left:
        ray.cancel(ref, force=True)
    ray.wait(left, num_returns=len(left), timeout=CANCEL_GRACE_S)


@dataclass(frozen=True)
class _Deadline:
    at: float  # time.monotonic() when the attempt's time is up
    should_stop: Callable[[], bool]


def _check_deadline(deadline: _Deadline) -> None:
    if deadline.should_stop():
        raise MergeStopped()
    if time.monotonic() >= deadline.at:
        raise MergeError("merge_timeout", "The merge did not finish within its time limit and was stopped.")


def _known_base(base_id: str) -> BaseModelSpec:
    if base_id not in BASES:
        raise MergeError("merge_base_unknown", "The adapter's base is not a fine-tuning base model.")
    return BASES[base_id]


def _export_prefix(prefix: str) -> str:
    try:
        check_prefix(prefix)
    except ValueError:
        raise MergeError("merge_weights_prefix", "The export's storage location was refused.") from None
    if not prefix.strip("/"):
        raise MergeError("merge_weights_prefix", "The export's storage location was refused.")
    return prefix.rstrip("/")


def _adapter_file(store: ObjectStore, req: MergeRequest, name: str) -> bytes:
    try:
        data = store.get_bytes(f"{req.adapter_prefix.rstrip('/')}/{name}")
    except (ObjectNotFound, OSError) as exc:
        raise MergeError("merge_adapter_unavailable", "The adapter's files could not be read.") from exc
    expected = (req.adapter_sha256 or {}).get(name)
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:
        raise MergeError("merge_adapter_changed", f"The adapter's {name} changed after the merge was requested.")
    return data


def _load_adapter(req: MergeRequest, store: ObjectStore) -> tuple[LoraAdapter, bytes, dict[str, str]]:
    """Read both adapter files once: the merge uses exactly the bytes whose digests it records."""
    base = _known_base(req.base_id)
    reviewed_licence(base)
    config = _adapter_file(store, req, ADAPTER_CONFIG)
    weights = _adapter_file(store, req, ADAPTER_MODEL)
    adapter = validate_adapter(config, lambda s, e: weights[s:e], len(weights), base)
    digests = {ADAPTER_CONFIG: hashlib.sha256(config).hexdigest(), ADAPTER_MODEL: hashlib.sha256(weights).hexdigest()}
    return adapter, weights, digests


def _base_dir(base: BaseModelSpec, req: MergeRequest) -> Path:
    try:
        return resolve_base_dir(base, parse_model_source(req.model_source), Path(req.cache_root))
    except (OSError, ValueError) as exc:
        raise MergeError("merge_base_unavailable", f"The files of {base.id} at its pinned revision are not available.") from exc


def _checked_text(path: Path, sha256: str) -> str:
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise MergeError("merge_base_digest", f"The base file {path.name}'s bytes do not match its pinned SHA-256.")
    return data.decode("utf-8", errors="replace")
