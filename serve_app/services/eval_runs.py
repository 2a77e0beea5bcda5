"""Eval runs (OpenAI's Evals API): create, retrieve, list, cancel, delete, and their output items.

Create checks the run's data source (evals/source.py: a refusal names its param, nothing is
created), copies the items under the account (storage/keys.py `eval_run_items`: a file deleted
later changes nothing) and the eval's criteria onto the run, and queues it; the worker drives it
(evals/run.py). Another account's eval, run, file or model answers 404 as a missing one does.
A run's status changes only in evals/transitions.py.
"""

from __future__ import annotations

import time

import orjson

from evals import source, transitions
from jobs.model_names import resolve_model
from openft.errors import Conflict, InvalidRequest, NotFound, unknown_parameter
from openft.ids import eval_run_id as new_run_id
from serve_app.schemas.common import Page
from serve_app.schemas.eval_runs import EvalRun, EvalRunDeleted, OutputItem
from serve_app.services.batches import parse_metadata
from serve_app.services.paging import check_limit, page_of
from serve_app.state import AppState
from storage import evals as repo
from storage import files as files_repo
from storage import keys
from storage.evals import RUN_OPEN
from storage.leases import lock_account
from storage.models import Account
from storage.models import EvalRun as RunRow

CREATE_KEYS = ("data_source", "name", "metadata")
RUN_STATUSES = ("queued", "in_progress", "completed", "canceled", "failed")


def report_url(state: AppState, eval_id: str, run_id: str) -> str:
    """The dashboard's page of the run: under `public_base_url` when set, else relative to the API's root."""
    return f"{state.settings.public_base_url or ''}/dashboard/#/evals/{eval_id}/runs/{run_id}"


def run_object(state: AppState, row: RunRow) -> EvalRun:
    return EvalRun(id=row.id, eval_id=row.eval_id, created_at=row.created_at, name=row.name, model=row.model,
                   status=row.status, data_source=row.data_source, metadata=row.run_metadata,
                   result_counts=row.result_counts, per_testing_criteria_results=row.per_criteria,
                   per_model_usage=row.per_model_usage, report_url=report_url(state, row.eval_id, row.id),
                   error=row.error)


def item_object(row) -> OutputItem:
    return OutputItem(id=row.id, run_id=row.run_id, eval_id=row.eval_id, created_at=row.created_at, status=row.status,
                      datasource_item_id=row.item_index, datasource_item=row.item, results=row.results,
                      sample=row.sample)


def get_eval(session, account: Account, eval_id: str):
    found = repo.get_eval(session, account.id, eval_id)
    if found is None:
        raise NotFound("No such eval.", param="eval_id")
    return found


def get_run(session, account: Account, eval_id: str, run_id: str) -> RunRow:
    get_eval(session, account, eval_id)
    found = repo.get_run(session, account.id, eval_id, run_id)
    if found is None:
        raise NotFound("No such run of this eval.", param="run_id")
    return found


def _reader(state: AppState, account: Account):
    def read_file(file_id: str) -> bytes:
        param = "data_source.source.id"
        with state.db.session() as session:
            row = files_repo.get_file(session, account.id, file_id)
            if row is None:
                raise NotFound("data_source.source.id does not name a file of yours. Upload the items with "
                               "purpose=evals.", code="file_not_found", param=param)
            if row.purpose != "evals":
                raise InvalidRequest("data_source.source.id must be a file uploaded with purpose=evals.",
                                     code="invalid_file_purpose", param=param)
            key = row.object_key
        return state.store.get_bytes(key)

    return read_file


def create_run(state: AppState, account: Account, eval_id: str, body: dict) -> EvalRun:
    for key in body:
        if key not in CREATE_KEYS:
            raise unknown_parameter(key)
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 256):
        raise InvalidRequest("name must be a string of at most 256 characters.", code="invalid_value", param="name")
    metadata = parse_metadata(body.get("metadata"))
    with state.db.session() as session:
        row = get_eval(session, account, eval_id)
        config, criteria = row.data_source_config, row.testing_criteria

    def resolve(model: str):
        with state.db.session() as session:
            return resolve_model(session, account.id, model)

    found = source.parse(body.get("data_source"), item_schema=config["item_schema"], criteria=criteria,
                         resolve=resolve, read_file=_reader(state, account), rate=state.settings.prices.batch_usd_per_mtok)
    run_id, now = new_run_id(), state.now()
    items_key = keys.eval_run_items(account.id, run_id)
    state.store.put_bytes(items_key, b"".join(orjson.dumps(item) + b"\n" for item in found.items))
    model = found.plan.sampling.model if found.plan.sampling else ""
    run = RunRow(id=run_id, account_id=account.id, eval_id=eval_id, name=name or f"{model or 'jsonl'} run",
                 model=model, data_source=body["data_source"], criteria=criteria, plan=found.plan.record(),
                 run_metadata=metadata, result_counts={"total": 0, "passed": 0, "failed": 0, "errored": 0},
                 per_criteria=[{"testing_criteria": c["name"], "passed": 0, "failed": 0} for c in criteria],
                 per_model_usage=[], created_at=now, created_ns=time.time_ns(),
                 expires_at=now + state.settings.file_retention_days * 86400)
    with state.db.session() as session:
        lock_account(session, account.id)
        if repo.get_eval(session, account.id, eval_id) is None:  # deleted while the source was read
            state.store.delete(items_key)
            raise NotFound("No such eval.", param="eval_id")
        transitions.add_new(session, run, now)
        return run_object(state, run)


def retrieve_run(state: AppState, account: Account, eval_id: str, run_id: str) -> EvalRun:
    with state.db.session() as session:
        return run_object(state, get_run(session, account, eval_id, run_id))


def _order(order: str) -> None:
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be asc or desc.", code="invalid_value", param="order")


def list_runs(state: AppState, account: Account, eval_id: str, *, limit: int, after: str | None, order: str,
              status: str | None) -> Page:
    check_limit(limit, 100)
    _order(order)
    if status is not None and status not in RUN_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(RUN_STATUSES)}.", code="invalid_value", param="status")
    with state.db.session() as session:
        get_eval(session, account, eval_id)
        rows, has_more = repo.list_runs(session, account.id, eval_id, limit=limit, after=after, order=order,
                                        status=status)
        return page_of([run_object(state, r) for r in rows], has_more)


def cancel_run(state: AppState, account: Account, eval_id: str, run_id: str) -> EvalRun:
    with state.db.session() as session:
        get_run(session, account, eval_id, run_id)
        row = transitions.lock_run(session, run_id, account.id)
        moved = transitions.cancel(session, row, state.now())
        if not moved.ok:
            raise Conflict(f"The run is {moved.status}; only a queued or in-progress run can be canceled.",
                           code="run_not_cancelable", param="run_id")
        return run_object(state, row)


def delete_run(state: AppState, account: Account, eval_id: str, run_id: str) -> EvalRunDeleted:
    with state.db.session() as session:
        get_run(session, account, eval_id, run_id)
        row = transitions.lock_run(session, run_id, account.id)
        if row.status in RUN_OPEN:
            raise Conflict("The run is still going; cancel it first, then delete it.", code="run_not_ended",
                           param="run_id")
        repo.delete_run_rows(session, row)
    state.store.delete_prefix(keys.eval_run(account.id, run_id))
    return EvalRunDeleted(deleted=True, run_id=run_id)


def list_items(state: AppState, account: Account, eval_id: str, run_id: str, *, limit: int, after: str | None,
               order: str, status: str | None) -> Page:
    check_limit(limit, 100)
    _order(order)
    if status is not None and status not in ("pass", "fail"):
        raise InvalidRequest("status must be pass or fail.", code="invalid_value", param="status")
    with state.db.session() as session:
        get_run(session, account, eval_id, run_id)
        rows, has_more = repo.list_items(session, account.id, run_id, limit=limit, after=after, order=order,
                                         status=status)
        return page_of([item_object(r) for r in rows], has_more)


def retrieve_item(state: AppState, account: Account, eval_id: str, run_id: str, item_id: str) -> OutputItem:
    with state.db.session() as session:
        get_run(session, account, eval_id, run_id)
        row = repo.get_item(session, account.id, run_id, item_id)
        if row is None:
            raise NotFound("No such output item of this run.", param="output_item_id")
        return item_object(row)
