"""`POST /v1/files/distill`: a batch's requests and results become a training file and a held-out
validation file (Ray Data pipeline in pipelines/distill_ray.py), recorded exactly like uploads.

The job-create shortcut (a batch results file as training_file) does the same in the background:
create leaves the job distilling (jobs/distilling.py) and the controller runs `distill_job`.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from sqlalchemy import select

from jobs import distilling
from jobs.spec import JobSpec
from openft.errors import InvalidRequest, ServiceError, unknown_parameter
from openft.ids import file_id as new_file_id
from pipelines.distill import DistillOptions
from pipelines.distill_ray import build_distill
from serve_app.schemas.files import FileObject
from serve_app.services import file_limits
from serve_app.services.files import file_object
from serve_app.services.files_upload import NewFile, finish_validation, record_files
from serve_app.services.job_files import check_files, job_files
from serve_app.services.job_params import file_not_found
from serve_app.state import AppState
from storage import batches as batches_repo
from storage import files as files_repo
from storage import keys
from storage.models import Account, File, Job

OPTION_KEYS = ("require_json", "keep_truncated", "eval_fraction", "seed")
BODY_KEYS = ("results_file", "requests_file", *OPTION_KEYS)


def _source(state: AppState, account: Account, file_id, param: str, purpose: str) -> File:
    if not isinstance(file_id, str):
        raise InvalidRequest(f"{param} must be a file id.", code="invalid_value", param=param)
    with state.db.session() as session:
        row = files_repo.get_file(session, account.id, file_id)
    if row is None:
        raise InvalidRequest(f"{param} does not name a file of yours.", code="file_not_found", param=param)
    if row.purpose != purpose:
        raise InvalidRequest(f"{param} must be a file uploaded with purpose={purpose}.", code="invalid_file_purpose",
                             param=param)
    return row


def parse_options(body: dict) -> DistillOptions:
    for key in body:
        if key not in BODY_KEYS:
            raise unknown_parameter(key)
    return DistillOptions(**{k: body[k] for k in OPTION_KEYS if k in body and body[k] is not None})


def distill(state: AppState, account: Account, body: dict) -> dict:
    options = parse_options(body)
    results = _source(state, account, body.get("results_file"), "results_file", "batch_output")
    batch_input = _batch_input(state, account, results)
    if batch_input is not None and body.get("requests_file") in (None, batch_input.id):
        requests, pick = batch_input, {"rule": "batch_input_file", "batch": _batch_of(state, account, results)}
    elif batch_input is not None:
        raise InvalidRequest(
            "results_file is a batch's output file, whose requests are that batch's input_file_id; omit requests_file "
            "or pass that file.", code="invalid_value", param="requests_file")
    else:
        requests, pick = _source(state, account, body.get("requests_file"), "requests_file", "batch"), {"rule": "given"}
    made, counts = _make(state, account, results, requests, options, pick=pick)
    return {"object": "gridline.distillation", **made, "counts": counts}


def _batch_of(state: AppState, account: Account, results: File) -> str | None:
    with state.db.session() as session:
        batch = batches_repo.batch_for_output(session, account.id, results.id)
        return batch.id if batch is not None else None


def _batch_input(state: AppState, account: Account, results: File) -> File | None:
    """The input file of the caller's batch whose output file `results` is (None: an uploaded results file)."""
    with state.db.session() as session:
        batch = batches_repo.batch_for_output(session, account.id, results.id)
        if batch is None:
            return None
        return files_repo.get_file(session, account.id, batch.input_file_id)


def _make(state: AppState, account: Account, results: File, requests: File, options: DistillOptions,
          keep=lambda: True, pick: dict | None = None) -> tuple[dict[str, FileObject | None], dict] | None:
    """Distill and record the training and validation files (both, or none: a refusal leaves
    nothing). `keep()` is asked once the rows are made: False discards them and returns None."""
    count, used = file_limits.usage(state, account.id)
    file_limits.check(state.settings, count, used, files=1, nbytes=1)  # before the pipeline runs
    out_prefix = keys.distill_output(account.id, new_file_id())
    try:
        out = build_distill(state.store.spec(), results.object_key, requests.object_key, out_prefix, options,
                            name=f"{results.id} distill")
        if not keep():
            state.store.delete_prefix(out_prefix + "/")
            return None
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
        made: dict[str, FileObject | None] = {}
        new: dict[str, NewFile] = {}
        for name, key, rows in (("training_file", out.train_key, out.train_rows),
                                ("validation_file", out.eval_key, out.eval_rows)):
            if rows == 0:
                state.store.delete(key)
                made[name] = None
                continue
            new[name] = _new_file(state, key, name, derived)
        # Both files or neither: one transaction, within the account's file limits.
        for name, row in zip(new, record_files(state, account, list(new.values()))):
            made[name] = file_object(row)
    except BaseException:
        state.store.delete_prefix(out_prefix + "/")
        raise
    counts = {"training_rows": out.train_rows, "validation_rows": out.eval_rows, "dropped": out.dropped}
    return made, counts


def _new_file(state: AppState, key: str, name: str, derived: dict) -> NewFile:
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


def _custom_ids(state: AppState, key: str, limit: int) -> set[str]:
    import orjson

    from pipelines.distill import iter_lines

    ids = set()
    for line in iter_lines(state.store.iter_chunks(key)):
        row = orjson.loads(line) if line.strip() else None
        if isinstance(row, dict):
            ids.add(row.get("custom_id"))
            if len(ids) >= limit:
                break
    return ids


def requests_file_for(state: AppState, account: Account, results: File) -> tuple[File | None, dict]:
    """(the requests file, how it was picked) for the distill shortcut.

    A batch's output file names its requests: that batch's own input file (no guessing). For an
    uploaded results file, the caller's batch (requests) file holding most of the first results'
    custom_ids (newest on a tie); results without a request are allowed (dropped as no_request),
    so a majority of the sample must match."""
    batch_input = _batch_input(state, account, results)
    if batch_input is not None:
        return batch_input, {"rule": "batch_input_file", "batch": _batch_of(state, account, results)}
    sample = _custom_ids(state, results.object_key, 50)
    with state.db.session() as session:
        candidates, _ = files_repo.list_files(session, account.id, purpose="batch", limit=50, after=None, order="desc")
    best, best_overlap = None, len(sample) // 2
    for candidate in candidates:
        overlap = len(sample & _custom_ids(state, candidate.object_key, 10**9))
        if overlap > best_overlap:
            best, best_overlap = candidate, overlap
    pick = {"rule": "custom_id_overlap", "sampled": len(sample), "matched": best_overlap if best else 0,
            "candidates": len(candidates)}
    return best, pick


def distill_job(state: AppState, job_id: str, owner: str) -> None:
    """The distill shortcut in the background (the controller's thread holds the job's distill
    lease as `owner`): find the batch's requests, distill with the defaults, record the files, run
    create's checks on them and admit the job (jobs/distilling.py). A refusal that create would
    have answered with a 400 fails the job with its code; once the job is not this distiller's (a
    cancel, a lost lease) nothing more is recorded."""
    with state.db.session() as session:
        job = session.get(Job, job_id)
        if job is None or job.lease_owner != owner:
            return
        account, spec = session.get(Account, job.account_id), JobSpec.from_record(job.spec)
    try:
        _distill_for_job(state, account, job_id, owner, spec)
    except ServiceError as refusal:
        param = refusal.param if refusal.param in ("training_file", "validation_file") else "training_file"
        message = refusal.message if refusal.param == param else f"Distilling training_file: {refusal.message}"
        with state.db.session() as session:
            distilling.failed(session, job_id, owner, state.now(), code=refusal.code or "invalid_request",
                              message=message, param=param)


def _still_mine(state: AppState, job_id: str, owner: str) -> bool:
    with state.db.session() as session:
        return session.scalar(select(Job.id).where(Job.id == job_id, Job.lease_owner == owner)) is not None


def _distill_for_job(state: AppState, account: Account, job_id: str, owner: str, spec: JobSpec) -> None:
    results_id = spec.derived_from["results_file"]
    with state.db.session() as session:
        results = files_repo.get_file(session, account.id, results_id)
    if results is None:
        raise file_not_found("training_file")
    requests, pick = requests_file_for(state, account, results)
    if requests is None:
        raise InvalidRequest(
            "training_file is a batch results file, but none of your batch files holds its requests. Upload the "
            "batch's input file with purpose=batch and create the job again, or call POST /v1/files/distill.",
            code="invalid_file_format", param="training_file",
        )
    done = _make(state, account, results, requests, DistillOptions(), keep=lambda: _still_mine(state, job_id, owner),
                 pick=pick)
    if done is None:
        return  # cancelled while it distilled: the rows are discarded
    made, counts = done
    derived = {
        "results_file": results.id, "requests_file": requests.id, "training_file": made["training_file"].id,
        "validation_file": made["validation_file"].id if made["validation_file"] else None, "counts": counts,
        "requests_pick": pick,
    }
    spec = replace(spec, training_file=derived["training_file"],
                   validation_file=spec.validation_file or derived["validation_file"]).with_derived(derived)
    training, validation = job_files(state, account.id, spec)
    quote = check_files(state, spec, training, validation)
    now = state.now()
    message = (f"Distilled {derived['results_file']} with its requests {derived['requests_file']} into "
               f"{derived['training_file']} (training) and {derived['validation_file']} (validation).")
    with state.db.session() as session:
        distilling.distilled(session, job_id, owner, now, spec=spec, quote=quote.model_dump(),
                             estimated_finish=quote.estimated_finish(now), derived_event=message,
                             settings=state.settings)
