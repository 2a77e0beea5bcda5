"""`POST /v1/files/distill`: a batch's requests and results become a training file and a held-out
validation file (Ray Data pipeline in pipelines/distill_ray.py), recorded exactly like uploads."""

from __future__ import annotations

import hashlib

from openft.errors import InvalidRequest, unknown_parameter
from openft.ids import file_id as new_file_id
from pipelines.distill import DistillOptions
from pipelines.distill_ray import build_distill
from serve_app.schemas.files import FileObject
from serve_app.services.files import file_object
from serve_app.services import file_limits
from serve_app.services.files_upload import NewFile, finish_validation, record_files
from serve_app.state import AppState
from storage import keys
from storage import files as files_repo
from storage.models import Account, File

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
    requests = _source(state, account, body.get("requests_file"), "requests_file", "batch")
    count, used = file_limits.usage(state, account.id)
    file_limits.check(state.settings, count, used, files=1, nbytes=1)  # before the pipeline runs
    out_prefix = keys.distill_output(account.id, new_file_id())
    try:
        out = build_distill(state.store.spec(), results.object_key, requests.object_key, out_prefix, options)
        derived = {
            "results_file": results.id, "requests_file": requests.id,
            "options": {k: getattr(options, k) for k in OPTION_KEYS},
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
    if made["training_file"] is None:
        raise InvalidRequest(
            "No result became a training row; see the counts by reason in a smaller run, or relax "
            "require_json / keep_truncated.", code="invalid_file_format", param="results_file",
        )
    return {
        "object": "gridline.distillation",
        "training_file": made["training_file"],
        "validation_file": made["validation_file"],
        "counts": {"training_rows": out.train_rows, "validation_rows": out.eval_rows, "dropped": out.dropped},
    }


def _new_file(state: AppState, key: str, name: str, derived: dict) -> NewFile:
    stats = finish_validation(state, key, "fine-tune", None)
    digest, size = hashlib.sha256(), 0
    for chunk in state.store.iter_chunks(key):
        digest.update(chunk)
        size += len(chunk)
    filename = "distilled-train.jsonl" if name == "training_file" else "distilled-validation.jsonl"
    return NewFile(
        file_id=new_file_id(), key=key, filename=filename, purpose="fine-tune", size=size,
        sha256=digest.hexdigest(), stats=stats, derived_from={**derived, "role": name},
    )


def _custom_ids(state: AppState, key: str, limit: int) -> set[str]:
    import orjson

    from pipelines.distill import iter_lines

    ids = set()
    for line in iter_lines(state.store.iter_chunks(key)):
        if line.strip():
            ids.add(orjson.loads(line).get("custom_id"))
            if len(ids) >= limit:
                break
    return ids


def requests_file_for(state: AppState, account: Account, results: File) -> File | None:
    """The caller's batch (requests) file holding most of the first results' custom_ids (newest on a tie).

    There is no Batch API here linking an output file to its input, so the shortcut looks for it
    among the account's `batch` files; results without a request are allowed (dropped as no_request),
    so a majority of the sample must match."""
    sample = _custom_ids(state, results.object_key, 50)
    with state.db.session() as session:
        candidates, _ = files_repo.list_files(session, account.id, purpose="batch", limit=50, after=None, order="desc")
    best, best_overlap = None, len(sample) // 2
    for candidate in candidates:
        overlap = len(sample & _custom_ids(state, candidate.object_key, 10**9))
        if overlap > best_overlap:
            best, best_overlap = candidate, overlap
    return best


def distill_shortcut(state: AppState, account: Account, body: dict) -> tuple[dict, dict | None]:
    """A job created with a batch results file as training_file trains on its distilled rows:
    convert with the defaults first and create the job on the derived files."""
    file_id = body.get("training_file")
    if not isinstance(file_id, str):
        return body, None
    with state.db.session() as session:
        row = files_repo.get_file(session, account.id, file_id)
    if row is None or row.purpose != "batch_output":
        return body, None
    requests = requests_file_for(state, account, row)
    if requests is None:
        raise InvalidRequest(
            "training_file is a batch results file, but none of your batch files holds its requests. Upload the "
            "batch's input file with purpose=batch, or call POST /v1/files/distill.",
            code="invalid_file_format", param="training_file",
        )
    out = distill(state, account, {"results_file": row.id, "requests_file": requests.id})
    derived = {
        "results_file": row.id, "requests_file": requests.id, "training_file": out["training_file"].id,
        "validation_file": out["validation_file"].id if out["validation_file"] else None, "counts": out["counts"],
    }
    body = {**body, "training_file": derived["training_file"]}
    if derived["validation_file"] and not body.get("validation_file"):
        body["validation_file"] = derived["validation_file"]
    return body, derived
