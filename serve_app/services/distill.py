"""`POST /v1/files/distill`: a batch's requests and results become a training file and a held-out
validation file, recorded exactly like uploads (files/distill.py makes and records them).

The job-create shortcut (a batch results file as training_file) does the same in the background:
create leaves the job distilling and the worker runs jobs/distilling.py `distill_job`.
"""

from __future__ import annotations

from files import distill as distilling
from files.distill import OPTION_KEYS
from openft.errors import InvalidRequest, unknown_parameter
from pipelines.distill import DistillOptions
from serve_app.services.files import file_object
from serve_app.state import AppState
from storage import files as files_repo
from storage.models import Account, File

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
    batch_input = distilling.batch_input(state, account.id, results)
    if batch_input is not None and body.get("requests_file") in (None, batch_input.id):
        requests, pick = batch_input, {"rule": "batch_input_file", "batch": distilling.batch_of(state, account.id, results)}
    elif batch_input is not None:
        raise InvalidRequest(
            "results_file is a batch's output file, whose requests are that batch's input_file_id; omit requests_file "
            "or pass that file.", code="invalid_value", param="requests_file")
    else:
        requests, pick = _source(state, account, body.get("requests_file"), "requests_file", "batch"), {"rule": "given"}
    made, counts = distilling.make(state, account.id, results, requests, options, pick=pick)
    files = {name: file_object(row) if row is not None else None for name, row in made.items()}
    return {"object": "gridline.distillation", **files, "counts": counts}
