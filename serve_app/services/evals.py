"""Evals (OpenAI's Evals API): create, retrieve, update (name, metadata), list, delete.

An eval is its items' schema (`data_source_config` of type `custom`: `item_schema`,
`include_sample_schema`) and its `testing_criteria`, each a grader that graders/validate.py
accepts with the item schema as the templates' scope (a reference to a property the schema does
not have is refused), the caller's models for model graders, and `pass_threshold` required on
text_similarity as OpenAI requires it. `logs` and `stored_completions` data sources are refused
by name: nothing here stores completions. Another account's eval answers 404 like a missing one.

Runs (serve_app/services/eval_runs.py) copy the eval's criteria when they are created, so an
update never changes a run; a delete takes the eval's runs with it.
"""

from __future__ import annotations

import time

from evals import transitions as run_transitions
from graders import Scope, validate
from openft.errors import InvalidRequest, NotFound, unknown_parameter
from openft.ids import eval_id as new_eval_id
from serve_app.schemas.common import Page
from serve_app.schemas.evals import Eval, EvalCustomDataSourceConfig, EvalDeleted
from serve_app.services.batches import parse_metadata
from graders.validate import record as grader_record
from serve_app.services.graders import rules
from serve_app.services.paging import check_limit, page_of
from serve_app.state import AppState
from storage import evals as repo
from storage import keys
from storage.models import Account
from storage.models import Eval as EvalRow

CREATE_KEYS = ("data_source_config", "testing_criteria", "name", "metadata")
CUSTOM_KEYS = ("type", "item_schema", "include_sample_schema")
MAX_CRITERIA = 32
MAX_NAME_CHARS = 256
# The sample namespace a run fills (graders/templates.py SAMPLE_FIELDS), as OpenAI's schema shows it.
SAMPLE_SCHEMA = {"type": "object", "properties": {
    "model": {"type": "string"}, "choices": {"type": "array"}, "output_text": {"type": "string"},
    "output_json": {"type": "object"}, "output_tools": {"type": "array"},
}, "required": ["model", "choices"]}


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def eval_object(row: EvalRow) -> Eval:
    config = row.data_source_config
    properties = {"item": config["item_schema"]}
    if config.get("include_sample_schema"):
        properties["sample"] = SAMPLE_SCHEMA
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return Eval(id=row.id, created_at=row.created_at, name=row.name, metadata=row.eval_metadata,
                data_source_config=EvalCustomDataSourceConfig(schema_=schema), testing_criteria=row.testing_criteria)


def _data_source_config(raw) -> dict:
    param = "data_source_config"
    if raw is None:
        raise _invalid("Missing data_source_config.", param, "missing_required_parameter")
    if not isinstance(raw, dict):
        raise _invalid("data_source_config must be an object.", param)
    kind = raw.get("type")
    if kind in ("logs", "stored_completions"):
        raise _invalid(f"data_source_config.type {kind} reads stored completions, and this service stores none; use "
                       "custom with an item_schema.", f"{param}.type", "unsupported_value")
    if kind != "custom":
        raise _invalid("data_source_config.type must be custom.", f"{param}.type",
                       "missing_required_parameter" if kind is None else "invalid_value")
    for key in raw:
        if key not in CUSTOM_KEYS:
            raise unknown_parameter(key, param)
    schema = raw.get("item_schema")
    if schema is None:
        raise _invalid("Missing data_source_config.item_schema.", f"{param}.item_schema", "missing_required_parameter")
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise _invalid("data_source_config.item_schema must be a JSON schema of an object.", f"{param}.item_schema")
    sample = raw.get("include_sample_schema", False)
    if not isinstance(sample, bool):
        raise _invalid("data_source_config.include_sample_schema must be true or false.",
                       f"{param}.include_sample_schema")
    return {"type": "custom", "item_schema": schema, "include_sample_schema": sample}


def _criteria(state: AppState, account: Account, raw, config: dict) -> list[dict]:
    param = "testing_criteria"
    if raw is None:
        raise _invalid("Missing testing_criteria.", param, "missing_required_parameter")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_CRITERIA:
        raise _invalid(f"testing_criteria must be a list of 1 to {MAX_CRITERIA} graders.", param)
    scope = Scope(item_schema=config["item_schema"], sample=config["include_sample_schema"])
    check = rules(state, account, scope, require_pass_threshold=True)
    records, names = [], set()
    for i, criterion in enumerate(raw):
        grader = validate(criterion, f"{param}[{i}]", check)
        if grader.name in names:
            raise _invalid(f"{param}[{i}].name is the name of an earlier criterion; names tell criteria apart in a "
                           "run's results: make them unique.", f"{param}[{i}].name")
        names.add(grader.name)
        records.append(grader_record(grader))
    return records


def _name(raw, default: str) -> str:
    if raw is None:
        return default
    if not isinstance(raw, str) or len(raw) > MAX_NAME_CHARS:
        raise _invalid(f"name must be a string of at most {MAX_NAME_CHARS} characters.", "name")
    return raw


def create_eval(state: AppState, account: Account, body: dict) -> Eval:
    for key in body:
        if key not in CREATE_KEYS:
            raise unknown_parameter(key)
    config = _data_source_config(body.get("data_source_config"))
    criteria = _criteria(state, account, body.get("testing_criteria"), config)
    name = _name(body.get("name"), "Untitled eval")
    metadata = parse_metadata(body.get("metadata"))
    now, ns = state.now(), time.time_ns()
    row = EvalRow(id=new_eval_id(), account_id=account.id, name=name, data_source_config=config,
                  testing_criteria=criteria, eval_metadata=metadata, created_at=now, created_ns=ns, updated_at=now,
                  updated_ns=ns)
    with state.db.session() as session:
        session.add(row)
        return eval_object(row)


def _not_found() -> NotFound:
    return NotFound("No such eval.", param="eval_id")


def retrieve_eval(state: AppState, account: Account, eval_id: str) -> Eval:
    with state.db.session() as session:
        row = repo.get_eval(session, account.id, eval_id)
        if row is None:
            raise _not_found()
        return eval_object(row)


def update_eval(state: AppState, account: Account, eval_id: str, body: dict) -> Eval:
    for key in body:
        if key not in ("name", "metadata"):
            raise unknown_parameter(key)
    name = _name(body.get("name"), "") if "name" in body else None
    metadata = parse_metadata(body.get("metadata")) if "metadata" in body else None
    with state.db.session() as session:
        row = repo.get_eval(session, account.id, eval_id)
        if row is None:
            raise _not_found()
        if "name" in body:
            row.name = name
        if "metadata" in body:
            row.eval_metadata = metadata
        row.updated_at, row.updated_ns = state.now(), time.time_ns()
        return eval_object(row)


def list_evals(state: AppState, account: Account, *, limit: int, after: str | None, order: str, order_by: str) -> Page:
    check_limit(limit, 100)
    if order not in ("asc", "desc"):
        raise _invalid("order must be asc or desc.", "order")
    if order_by not in ("created_at", "updated_at"):
        raise _invalid("order_by must be created_at or updated_at.", "order_by")
    with state.db.session() as session:
        rows, has_more = repo.list_evals(session, account.id, limit=limit, after=after, order=order, order_by=order_by)
        return page_of([eval_object(r) for r in rows], has_more)


def delete_eval(state: AppState, account: Account, eval_id: str) -> EvalDeleted:
    """The eval and its runs with their items (OpenAI deletes them together): a going run is
    canceled first (its driver finds its row gone and writes nothing more), then every row goes,
    then the runs' objects."""
    with state.db.session() as session:
        row = repo.get_eval(session, account.id, eval_id)
        if row is None:
            raise _not_found()
        run_ids = repo.run_ids_of(session, account.id, eval_id)
        for run_id in run_ids:
            run = run_transitions.lock_run(session, run_id, account.id)
            run_transitions.cancel(session, run, state.now())
            repo.delete_run_rows(session, run)
        session.delete(row)
    for run_id in run_ids:
        state.store.delete_prefix(keys.eval_run(account.id, run_id))
    return EvalDeleted(deleted=True, eval_id=eval_id)
