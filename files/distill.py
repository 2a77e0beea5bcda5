"""A batch's requests and results made into a training file and a held-out validation file (Ray
Data pipeline in pipelines/distill_ray.py), recorded exactly like uploads (files/record.py).

Where it sits: `POST /v1/files/distill` (serve_app/services/distill.py) and the job-create
shortcut in the background (jobs/distilling.py `distill_job`, on a worker thread) call `make`;
the shortcut finds the requests of a results file with `requests_file_for`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from files import limits
from files.record import NewFile, finish_validation, record_files
from openft.errors import InvalidRequest
from openft.ids import file_id as new_file_id
from pipelines.distill import DistillOptions, iter_lines
from pipelines.distill_ray import build_distill
from storage import batches as batches_repo
from storage import files as files_repo
from storage import keys
from storage.context import Context
from storage.models import File

OPTION_KEYS = ("require_json", "keep_truncated", "eval_fraction", "seed")


def batch_of(state: Context, account_id: str, results: File) -> str | None:
    with state.db.session() as session:
        batch = batches_repo.batch_for_output(session, account_id, results.id)
        return batch.id if batch is not None else None


def batch_input(state: Context, account_id: str, results: File) -> File | None:
    """The input file of the caller's batch whose output file `results` is (None: an uploaded results file)."""
    with state.db.session() as session:
        batch = batches_repo.batch_for_output(session, account_id, results.id)
        if batch is None:
            return None
        return files_repo.get_file(session, account_id, batch.input_file_id)


@dataclass
class Distilled:
    """A distillation's files, stored and validated under `prefix` but not yet recorded."""

    prefix: str
    files: dict[str, NewFile]  # training_file, and validation_file unless no row was held out
    counts: dict[str, int]

    def discard(self, state: Context) -> None:
        state.store.delete_prefix(self.prefix + "/")


def make_files(state: Context, account_id: str, results: File, requests: File, options: DistillOptions, *,
               prefix: str, pick: dict | None = None) -> Distilled:
    """Distill `results` with `requests` into objects under `prefix` and validate them as uploads
    (a refusal leaves nothing stored)."""
    count, used = limits.usage(state, account_id)
    limits.check(state.settings, count, used, files=1, nbytes=1)  # before the pipeline runs
    try:
        out = build_distill(state.store.spec(), results.object_key, requests.object_key, prefix, options,
                            name=f"{results.id} distill")
        if out.train_rows == 0:
            raise InvalidRequest(
                "No result became a training row; see the counts by reason in a smaller run, or relax "
                "require_json / keep_truncated.", code="invalid_file_format", param="results_file",
            )
        derived = {
            "results_file": results.id, "requests_file": requests.id,
            "options": {k: getattr(options, k) for k in OPTION_KEYS},
            "requests_pick": pick or {"rule": "given"},  # how requests_file was chosen
        }
        new: dict[str, NewFile] = {}
        for name, key, rows in (("training_file", out.train_key, out.train_rows),
                                ("validation_file", out.eval_key, out.eval_rows)):
            if rows == 0:
                state.store.delete(key)
                continue
            new[name] = _new_file(state, key, name, derived)
    except BaseException:
        state.store.delete_prefix(prefix + "/")
        raise
    counts = {"training_rows": out.train_rows, "validation_rows": out.eval_rows, "dropped": out.dropped}
    return Distilled(prefix, new, counts)


def make(state: Context, account_id: str, results: File, requests: File, options: DistillOptions,
         pick: dict | None = None) -> tuple[dict[str, File | None], dict]:
    """Distill and record the training and validation files (both, or none: a refusal leaves nothing)."""
    made = make_files(state, account_id, results, requests, options,
                      prefix=keys.distill_output(account_id, new_file_id()), pick=pick)
    try:
        rows = record_files(state, account_id, list(made.files.values()))  # both or neither, within the limits
    except BaseException:
        made.discard(state)
        raise
    return {"training_file": None, "validation_file": None, **dict(zip(made.files, rows))}, made.counts


def _new_file(state: Context, key: str, name: str, derived: dict) -> NewFile:
    new_id = new_file_id()
    stats = finish_validation(state, key, "fine-tune", None, file_id=new_id)
    digest, size = hashlib.sha256(), 0
    for chunk in state.store.iter_chunks(key):
        digest.update(chunk)
        size += len(chunk)
    filename = "distilled-train.jsonl" if name == "training_file" else "distilled-validation.jsonl"
    return NewFile(
        file_id=new_id, key=key, filename=filename, purpose="fine-tune", size=size,
        sha256=digest.hexdigest(), stats=stats, derived_from={**derived, "role": name},
    )


def _custom_ids(state: Context, key: str, limit: int) -> set[str]:
    ids = set()
    for line in iter_lines(state.store.iter_chunks(key)):
        row = orjson.loads(line) if line.strip() else None
        if isinstance(row, dict):
            ids.add(row.get("custom_id"))
            if len(ids) >= limit:
                break
    return ids


def requests_file_for(state: Context, account_id: str, results: File) -> tuple[File | None, dict]:
    """(the requests file, how it was picked) for the distill shortcut.

    A batch's output file names its requests: that batch's own input file (no guessing). For an
    uploaded results file, the caller's batch (requests) file holding most of the first results'
    custom_ids (newest on a tie); results without a request are allowed (dropped as no_request),
    so a majority of the sample must match."""
    given = batch_input(state, account_id, results)
    if given is not None:
        return given, {"rule": "batch_input_file", "batch": batch_of(state, account_id, results)}
    sample = _custom_ids(state, results.object_key, 50)
    with state.db.session() as session:
        candidates, _ = files_repo.list_files(session, account_id, purpose="batch", limit=50, after=None, order="desc")
    best, best_overlap = None, len(sample) // 2
    for candidate in candidates:
        overlap = len(sample & _custom_ids(state, candidate.object_key, 10**9))
        if overlap > best_overlap:
            best, best_overlap = candidate, overlap
    pick = {"rule": "custom_id_overlap", "sampled": len(sample), "matched": best_overlap if best else 0,
            "candidates": len(candidates)}
    return best, pick
