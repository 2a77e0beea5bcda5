"""A stored object becoming a file: its validation (the streaming validator's stats, or a pass over
the stored object, with the lines past the inline threshold checked on Ray Data) and its files
rows, written all or none within the account's file limits (files/limits.py).

Where it sits: uploads (serve_app/services/files_upload.py) stream through `new_validator` and call
`finish_validation` and `record_files`; distillations (files/distill.py) validate and record the
files they made the same way, so a derived file is exactly an upload's equal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from files import limits
from openft import metrics
from openft.errors import InvalidRequest, PayloadTooLarge
from openft.limits import FILE_BYTES
from pipelines.validate import FileStats, FileValidationError, StreamingValidator
from pipelines.validate_ray import build_validation
from storage.context import Context
from storage.files import add_file
from storage.models import File

DAY = 86400


def validation_refusal(exc: FileValidationError) -> InvalidRequest | PayloadTooLarge:
    cls = PayloadTooLarge if exc.code == "file_too_large" else InvalidRequest
    return cls(exc.message, code=exc.code, param="file")


def stats_record(stats: FileStats) -> dict:
    if stats.row_kind is None:  # batch and evals files: rows only
        return {"rows": stats.rows}
    return {
        "row_kind": stats.row_kind,
        "rows": stats.rows,
        "messages": stats.messages,
        "content_bytes": stats.content_bytes,
        "token_upper_bound": stats.token_upper_bound(),
        "token_estimates": stats.token_estimates(),
    }


def new_validator(state: Context, purpose: str) -> StreamingValidator:
    return StreamingValidator(
        purpose, max_bytes=FILE_BYTES[purpose], full_check_bytes=state.settings.validate_ray_threshold_bytes
    )


def finish_validation(state: Context, key: str, purpose: str, validator: StreamingValidator | None,
                      *, file_id: str) -> FileStats:  # fmt: skip
    """Stats of the stored object `key` (file `file_id`): from the validator its bytes streamed
    through, or (None) by streaming the stored object; lines past the inline threshold are checked
    on Ray Data."""
    try:
        if validator is None:
            validator = new_validator(state, purpose)
            for chunk in state.store.iter_chunks(key):
                validator.feed(chunk)
        stats = validator.finish()
        if not validator.complete:
            started = time.monotonic()
            stats = build_validation(
                state.store.spec(), key, purpose,
                start_offset=validator.checked_offset, start_line=validator.checked_line,
                block_bytes=state.settings.validate_range_bytes_max, head_stats=stats, max_bytes=FILE_BYTES[purpose],
                name=f"{file_id} validate",
            )
            metrics.record_upload_validation(stats.bytes - validator.checked_offset, time.monotonic() - started)
    except FileValidationError as exc:
        raise validation_refusal(exc) from None
    return stats


@dataclass(frozen=True)
class NewFile:
    """A stored, validated object about to become a file."""

    file_id: str
    key: str
    filename: str
    purpose: str
    size: int
    sha256: str
    stats: FileStats
    derived_from: dict | None = None


def file_rows(state: Context, account_id: str, new: list[NewFile]) -> list[File]:
    """The files rows of stored, validated objects, not yet added."""
    now = state.now()
    return [
        File(
            id=f.file_id, created_ns=time.time_ns(), account_id=account_id, filename=f.filename, purpose=f.purpose,
            bytes=f.size, created_at=now, expires_at=now + state.settings.file_retention_days * DAY,
            status="processed", sha256=f.sha256, object_key=f.key, stats=stats_record(f.stats),
            derived_from=f.derived_from,
        )
        for f in new
    ]


def add_files(session, state: Context, account_id: str, rows: list[File]) -> None:
    """Add `rows` in the caller's transaction, within the account's file limits (checked under its lock)."""
    limits.check_locked(session, state.settings, account_id, state.now(), files=len(rows),
                        nbytes=sum(row.bytes for row in rows))
    for row in rows:
        add_file(session, row)


def record_files(state: Context, account_id: str, new: list[NewFile]) -> list[File]:
    """The files rows for stored, validated objects, all or none, within the account's file limits
    (checked under its lock); deletes the objects if the rows cannot be written."""
    rows = file_rows(state, account_id, new)
    try:
        with state.db.session() as session:
            add_files(session, state, account_id, rows)
            return rows
    except BaseException:
        for f in new:
            state.store.delete(f.key)
        raise
