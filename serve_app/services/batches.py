"""Batches: create (every refusal, the create-time scan, the open-batch limit), list, retrieve, cancel.

Create refuses before anything is made: the body's fields (OpenAI's: input_file_id, endpoint,
completion_window, metadata), the input file (the caller's, purpose `batch`), the open-batch limit,
then the scan of its lines (batches/scan.py), and the limit again under the account's lock with the
row's insert so that concurrent creates at the limit cannot both pass. The batch's life from
there is batches/transitions.py's; the controller runs it.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from batches import limits, transitions
from batches.billing import quote as batch_quote
from batches.plan import Plan
from batches.scan import scan
from jobs.model_names import resolve_model
from jobs.params import METADATA_KEY_CHARS, METADATA_PAIRS, METADATA_VALUE_CHARS
from openft.errors import Conflict, InvalidRequest, NotFound, unknown_parameter
from openft.ids import batch_id as new_batch_id
from pipelines.distill import iter_lines
from serve_app.schemas.batches import Batch, BatchError, BatchGridline, BatchRequestCounts, BatchUsage, Errors
from serve_app.schemas.common import Page
from serve_app.services.paging import check_limit
from serve_app.state import AppState
from storage import batches as batches_repo
from storage import files as files_repo
from storage.leases import lock_account
from storage.models import Account
from storage.models import Batch as BatchRow

BODY_KEYS = ("input_file_id", "endpoint", "completion_window", "metadata")
ENDPOINTS = ("/v1/chat/completions",)
WINDOWS = ("24h",)


def batch_object(row: BatchRow) -> Batch:
    plan = Plan.from_record(row.plan)
    counts = row.request_counts or {"total": plan.lines, "completed": 0, "failed": 0}
    usage = None
    if row.usage:
        usage = BatchUsage(input_tokens=row.usage["input_tokens"], output_tokens=row.usage["output_tokens"],
                           total_tokens=row.usage["input_tokens"] + row.usage["output_tokens"],
                           input_tokens_details={"cached_tokens": 0}, output_tokens_details={"reasoning_tokens": 0})
    quote = {k: v for k, v in row.quote.items() if k != "max_charge_cents"} if row.quote else None
    return Batch(
        id=row.id, completion_window=row.completion_window, created_at=row.created_at, endpoint=row.endpoint,
        input_file_id=row.input_file_id, status=row.status, cancelled_at=row.cancelled_at,
        cancelling_at=row.cancelling_at, completed_at=row.completed_at, error_file_id=row.error_file_id,
        errors=Errors(data=[BatchError(**e) for e in row.errors], object="list") if row.errors else None,
        expired_at=row.expired_at, expires_at=row.expires_at, failed_at=row.failed_at,
        finalizing_at=row.finalizing_at, in_progress_at=row.in_progress_at, metadata=row.batch_metadata,
        model=row.model, output_file_id=row.output_file_id, request_counts=BatchRequestCounts(**counts), usage=usage,
        gridline=BatchGridline(base=row.model, models=[m.name for m in plan.models],
                               refused_models={name: asdict(r) for name, r in plan.refused_models.items()}, quote=quote,
                               charge=row.charge),
    )


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def _required_string(body: dict, key: str) -> str:
    value = body.get(key)
    if value is None:
        raise _invalid(f"Missing {key}.", key, "missing_required_parameter")
    if not isinstance(value, str):
        raise _invalid(f"{key} must be a string.", key)
    return value


def parse_metadata(raw) -> dict[str, str] | None:
    """OpenAI's `metadata`: at most 16 string pairs (batches, evals)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > METADATA_PAIRS:
        raise _invalid(f"metadata must be an object of at most {METADATA_PAIRS} pairs.", "metadata")
    for key, value in raw.items():
        if len(key) > METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > METADATA_VALUE_CHARS:
            raise _invalid(f"metadata keys are strings of at most {METADATA_KEY_CHARS} characters, values strings "
                           f"of at most {METADATA_VALUE_CHARS}.", "metadata")
    return dict(raw)


def parse_create(body: dict) -> tuple[str, str, str, dict[str, str] | None]:
    for key in body:
        if key not in BODY_KEYS:
            raise unknown_parameter(key)
    file_id = _required_string(body, "input_file_id")
    endpoint = _required_string(body, "endpoint")
    if endpoint not in ENDPOINTS:
        raise _invalid("endpoint must be /v1/chat/completions: batches here run chat completions only.", "endpoint",
                       "unsupported_value")
    window = _required_string(body, "completion_window")
    if window not in WINDOWS:
        raise _invalid("completion_window must be 24h.", "completion_window", "unsupported_value")
    return file_id, endpoint, window, parse_metadata(body.get("metadata"))


def create_batch(state: AppState, account: Account, body: dict) -> Batch:
    file_id, endpoint, window, metadata = parse_create(body)
    with state.db.session() as session:
        # Whose file it is comes first: at its open-batch limit, another account's file id must still
        # answer file_not_found, not say how many batches this account has open.
        source = files_repo.get_file(session, account.id, file_id)
        if source is None:
            raise _invalid("input_file_id does not name a file of yours. Upload the requests with purpose=batch.",
                           "input_file_id", "file_not_found")
        if source.purpose != "batch":
            raise _invalid("input_file_id must be a file uploaded with purpose=batch.", "input_file_id",
                           "invalid_file_purpose")
        limits.check_open_batches(session, account.id, state.settings)  # fail fast; again under the lock

    with state.db.session() as session:
        found = scan(iter_lines(state.store.iter_chunks(source.object_key)),
                     lambda name: resolve_model(session, account.id, name), endpoint=endpoint)
    now = state.now()
    with state.db.session() as session:
        lock_account(session, account.id)
        limits.check_open_batches(session, account.id, state.settings)
        if files_repo.get_file(session, account.id, file_id) is None:  # deleted while the scan ran
            raise _invalid("input_file_id does not name a file of yours.", "input_file_id", "file_not_found")
        quote = batch_quote(state.settings, found.base_id, found.tokens_upper_bound) \
            if state.settings.billing_enabled else None
        row = BatchRow(
            id=new_batch_id(), account_id=account.id, endpoint=endpoint, completion_window=window,
            input_file_id=file_id, model=found.base_id, batch_metadata=metadata, plan=found.plan().record(),
            created_at=now, created_ns=time.time_ns(), quote=quote,
            request_counts={"total": found.lines, "completed": 0, "failed": 0},
        )
        transitions.add_new(session, row, now, state.settings.batch_completion_window_seconds)
        return batch_object(row)


def _not_found() -> NotFound:
    return NotFound("No such batch.", param="batch_id")


def retrieve_batch(state: AppState, account: Account, batch_id: str) -> Batch:
    with state.db.session() as session:
        row = batches_repo.get_batch(session, account.id, batch_id)
        if row is None:
            raise _not_found()
        return batch_object(row)


def list_batches(state: AppState, account: Account, *, limit: int, after: str | None) -> Page[Batch]:
    check_limit(limit, 100)
    with state.db.session() as session:
        rows, has_more = batches_repo.list_batches(session, account.id, limit=limit, after=after)
        data = [batch_object(r) for r in rows]
    return Page[Batch](data=data, has_more=has_more, first_id=data[0].id if data else None,
                       last_id=data[-1].id if data else None)


def cancel_batch(state: AppState, account: Account, batch_id: str) -> Batch:
    now = state.now()
    with state.db.session() as session:
        row = transitions.lock_batch(session, batch_id, account.id)
        if row is None:
            raise _not_found()
        moved = transitions.cancel(session, row, now)
        if not moved.ok:
            raise Conflict(f"This batch cannot be cancelled: {moved.why}.", code="invalid_state", param="batch_id")
        return batch_object(row)
