"""Streaming upload: one pass over the request body parses multipart, validates each line,
hashes and writes to the object store; the stored object becomes visible only if every check
passed. Files above `validate_ray_threshold_bytes` have their remaining lines validated by the
Ray Data pipeline over the stored object, which still reports the file's first invalid line.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from contextlib import ExitStack
from typing import AsyncIterator

from openft.errors import InvalidRequest, PayloadTooLarge, ServiceError
from openft.ids import file_id as new_file_id
from pipelines.validate import FileStats, FileValidationError, StreamingValidator
from pipelines.validate_ray import build_validation
from serve_app.multipart_stream import MultipartStream, PartData, PartEnd, PartStart, boundary_of
from serve_app.schemas.files import UPLOAD_PURPOSES
from serve_app.state import AppState
from storage import keys
from storage.files import add_file
from storage.models import Account, File

MAX_BYTES = {"fine-tune": 64 * 1024 * 1024, "batch": 200 * 1024 * 1024, "batch_output": 200 * 1024 * 1024}
MAX_FIELD_BYTES = 1024
BATCH_BYTES = 1024 * 1024
DAY = 86400


def _validation_refusal(exc: FileValidationError) -> InvalidRequest | PayloadTooLarge:
    cls = PayloadTooLarge if exc.code == "file_too_large" else InvalidRequest
    return cls(exc.message, code=exc.code, param="file")


def _check_purpose(purpose: str | None) -> str:
    if purpose is None:
        raise InvalidRequest("Missing `purpose`: one of " + ", ".join(UPLOAD_PURPOSES) + ".",
                             code="missing_required_parameter", param="purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest("`purpose` must be one of " + ", ".join(UPLOAD_PURPOSES) + ".",
                             code="invalid_value", param="purpose")
    return purpose


def _stats_record(stats: FileStats) -> dict:
    if stats.row_kind is None:  # batch files: rows only
        return {"rows": stats.rows}
    return {
        "row_kind": stats.row_kind,
        "rows": stats.rows,
        "messages": stats.messages,
        "content_bytes": stats.content_bytes,
        "token_upper_bound": stats.token_upper_bound(),
        "token_estimates": stats.token_estimates(),
    }


def new_validator(state: AppState, purpose: str) -> StreamingValidator:
    return StreamingValidator(
        purpose, max_bytes=MAX_BYTES[purpose], full_check_bytes=state.settings.validate_ray_threshold_bytes
    )


def finish_validation(state: AppState, key: str, purpose: str, validator: StreamingValidator | None) -> FileStats:
    """Stats of the stored object `key`: from the validator its bytes streamed through, or (None)
    by streaming the stored object; lines past the inline threshold are checked on Ray Data."""
    try:
        if validator is None:
            validator = new_validator(state, purpose)
            for chunk in state.store.iter_chunks(key):
                validator.feed(chunk)
        stats = validator.finish()
        if not validator.complete:
            stats = build_validation(
                state.store.spec(), key, purpose,
                start_offset=validator.checked_offset, start_line=validator.checked_line,
                block_bytes=state.settings.validate_range_bytes_max, head_stats=stats, max_bytes=MAX_BYTES[purpose],
            )
    except FileValidationError as exc:
        raise _validation_refusal(exc) from None
    return stats


def record_file(
    state: AppState, account: Account, *, file_id: str, key: str, filename: str, purpose: str, size: int,
    sha256: str, stats: FileStats, derived_from: dict | None = None,
) -> File:
    """The files row for a stored, validated object; deletes the object if the row cannot be written."""
    now = state.now()
    row = File(
        id=file_id, created_ns=time.time_ns(), account_id=account.id, filename=filename, purpose=purpose,
        bytes=size, created_at=now, expires_at=now + state.settings.file_retention_days * DAY, status="processed",
        sha256=sha256, object_key=key, stats=_stats_record(stats), derived_from=derived_from,
    )
    try:
        with state.db.session() as session:
            return add_file(session, row)
    except BaseException:
        state.store.delete(key)
        raise


class _Upload:
    """The synchronous half of an upload; every method runs in a worker thread."""

    def __init__(self, state: AppState, account: Account):
        self.state = state
        self.account = account
        self.fields: dict[str, bytearray] = {}
        self.part: str | None = None
        self.filename: str | None = None
        self.file_id = new_file_id()
        self.key = keys.upload(account.id, self.file_id)
        self.stack = ExitStack()
        self.writer = None
        self.hasher = hashlib.sha256()
        self.size = 0
        self.validator: StreamingValidator | None = None

    def _new_validator(self, purpose: str) -> StreamingValidator:
        return new_validator(self.state, purpose)

    def feed(self, events: list) -> None:
        for event in events:
            if isinstance(event, PartStart):
                self.part = event.name
                if event.name == "file":
                    self._start_file(event.filename)
                else:
                    self.fields[event.name] = bytearray()
            elif isinstance(event, PartData):
                if self.part == "file":
                    self._write(event.data)
                elif self.part is not None:
                    value = self.fields[self.part]
                    value += event.data
                    if len(value) > MAX_FIELD_BYTES:
                        raise InvalidRequest("A form field is too long.", code="invalid_value", param=self.part)
            elif isinstance(event, PartEnd):
                self.part = None

    def _start_file(self, filename: str | None) -> None:
        if self.writer is not None:
            raise InvalidRequest("Send exactly one `file` part.", code="invalid_request", param="file")
        self.filename = (filename or "upload.jsonl")[:512]
        purpose = self._purpose()
        if purpose is not None:
            self.validator = self._new_validator(_check_purpose(purpose))
        self.writer = self.stack.enter_context(self.state.store.writer(self.key))

    def _purpose(self) -> str | None:
        raw = self.fields.get("purpose")
        return None if raw is None else raw.decode("utf-8", "replace").strip()

    def _write(self, data: bytes) -> None:
        self.size += len(data)
        if self.validator is not None:
            try:
                self.validator.feed(data)
            except FileValidationError as exc:
                raise _validation_refusal(exc) from None
        elif self.size > max(MAX_BYTES.values()):
            raise PayloadTooLarge("The file is over the size limit.", code="file_too_large", param="file")
        self.hasher.update(data)
        self.writer.write(data)

    def complete(self) -> File:
        purpose = _check_purpose(self._purpose())
        if self.writer is None:
            raise InvalidRequest("Missing `file` part.", code="missing_required_parameter", param="file")
        self.stack.close()  # the object is now stored; it is deleted again if a check below fails
        try:
            stats = finish_validation(self.state, self.key, purpose, self.validator)
        except BaseException:
            self.state.store.delete(self.key)
            raise
        return record_file(
            self.state, self.account, file_id=self.file_id, key=self.key, filename=self.filename or "upload.jsonl",
            purpose=purpose, size=self.size, sha256=self.hasher.hexdigest(), stats=stats,
        )

    def abort(self) -> None:
        # Closing the writer's context with an exception discards the half-written object.
        self.stack.__exit__(InvalidRequest, InvalidRequest("upload aborted"), None)


async def upload_file(state: AppState, account: Account, content_type: str | None, body: AsyncIterator[bytes]) -> File:
    stream = MultipartStream(boundary_of(content_type))
    upload = _Upload(state, account)
    pending = bytearray()
    try:
        async for chunk in body:
            pending += chunk
            if len(pending) >= BATCH_BYTES:
                data, pending = bytes(pending), bytearray()
                await asyncio.to_thread(lambda: upload.feed(stream.feed(data)))
        data = bytes(pending)
        await asyncio.to_thread(lambda: upload.feed(stream.feed(data) + stream.finish()))
        return await asyncio.to_thread(upload.complete)
    except ServiceError:
        await asyncio.to_thread(upload.abort)
        # Read (and drop) the rest of the body: a client still sending when the server answers
        # sees a broken connection instead of the refusal, and SDKs retry those.
        async for _ in body:
            pass
        raise
    except BaseException:
        await asyncio.to_thread(upload.abort)
        raise
