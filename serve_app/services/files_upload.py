"""Streaming upload: one pass over the request body parses multipart, validates each line,
hashes and writes to the object store; the stored object becomes visible only if every check
passed. Files above `validate_ray_threshold_bytes` have their remaining lines validated by the
Ray Data pipeline over the stored object, which still reports the file's first invalid line.

Rules of the form (the framing rules are serve_app/multipart_stream.py's):
- Each field at most once, `file` and `purpose` included (`400 invalid_request`, param the field):
  a second `purpose` cannot change what the file was checked as.
- A `purpose` before the file picks the validator the file streams through. A `purpose` after it
  (curl -F file=@x -F purpose=...) is still the only one: the stored object is then validated in
  full for it, before the row that makes the file visible is written.
- Other fields are ignored, but count toward `upload_max_form_fields` and their size is capped.
- All or nothing: only a body that reached its closing boundary (and so its Content-Length, or
  its chunked end) is stored; a refused or cut-off upload leaves no object and no row.
- Bounded: a Content-Length over `MAX_BODY_BYTES` is refused before a byte is read; after any
  refusal at most `upload_drain_bytes` more are read (so the client reads the refusal), and a
  longer rest is left unread, the refusal closing the connection.
- The account's file limits (files/limits.py) before a byte is read, while streaming, and under the
  account's lock when the row is inserted (files/record.py `record_files`).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from contextlib import ExitStack
from typing import AsyncIterator, Mapping

from starlette.requests import ClientDisconnect

from files import limits
from files.record import NewFile, finish_validation, new_validator, record_files, validation_refusal
from openft.errors import InvalidRequest, PayloadTooLarge, ServiceError
from openft.ids import file_id as new_file_id
from openft.limits import FILE_BYTES, MIB
from pipelines.validate import FileValidationError, StreamingValidator
from serve_app.multipart_stream import MultipartStream, PartData, PartEnd, PartStart, boundary_of, incomplete
from serve_app.request_body import declared_length
from serve_app.request_params import BEYOND
from serve_app.schemas.files import UPLOAD_PURPOSES
from serve_app.state import AppState
from storage import keys
from storage.models import Account, File

# The largest file plus room for the form's other parts (16 fields of 1 KiB, their headers) and framing.
MAX_BODY_BYTES = max(FILE_BYTES.values()) + MIB
MAX_FIELD_BYTES = 1024
BATCH_BYTES = MIB
# A refusal sent before the body was read to its end: the rest is not read, the connection closes.
CLOSE_CONNECTION = {"Connection": "close"}


def _check_purpose(purpose: str | None) -> str:
    if purpose is None:
        raise InvalidRequest("Missing `purpose`: one of " + ", ".join(UPLOAD_PURPOSES) + ".",
                             code="missing_required_parameter", param="purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest("`purpose` must be one of " + ", ".join(UPLOAD_PURPOSES) + ".",
                             code="invalid_value", param="purpose")
    return purpose


class _Upload:
    """The synchronous half of an upload; every method runs in a worker thread, one at a time
    (a cancelled request's abort waits for the chunk still being written)."""

    def __init__(self, state: AppState, account: Account, used_bytes: int):
        self.state = state
        self.account = account
        self.used_bytes = used_bytes  # by the account's files when the upload began
        self.fields: dict[str, bytearray] = {}
        self.seen: set[str] = set()
        self.part: str | None = None
        self.filename: str | None = None
        self.file_id = new_file_id()
        self.key = keys.upload(account.id, self.file_id)
        self.stack = ExitStack()
        self.writer = None
        self.hasher = hashlib.sha256()
        self.size = 0
        self.validator: StreamingValidator | None = None
        self.lock = threading.Lock()

    def feed(self, events: list) -> None:
        with self.lock:
            for event in events:
                self._event(event)

    def _event(self, event) -> None:
        if isinstance(event, PartStart):
            if event.name in self.seen:
                raise InvalidRequest(f"The form sends `{event.name}` twice; send each field once.",
                                     code="invalid_request", param=event.name)
            self.seen.add(event.name)
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
        self.filename = (filename or "upload.jsonl")[:512]
        purpose = self._purpose()
        if purpose is not None:
            self.validator = new_validator(self.state, _check_purpose(purpose))
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
                raise validation_refusal(exc) from None
        elif self.size > max(FILE_BYTES.values()):
            raise PayloadTooLarge("The file is over the size limit.", code="file_too_large", param="file")
        if self.used_bytes + self.size > self.state.settings.account_max_file_bytes:
            raise limits.over_bytes(self.state.settings, self.used_bytes)
        self.hasher.update(data)
        self.writer.write(data)

    def complete(self) -> File:
        with self.lock:
            purpose = _check_purpose(self._purpose())
            if self.writer is None:
                raise InvalidRequest("Missing `file` part.", code="missing_required_parameter", param="file")
            self.stack.close()  # the object is now stored; it is deleted again if a check below fails
            try:
                stats = finish_validation(self.state, self.key, purpose, self.validator, file_id=self.file_id)
            except BaseException:
                self.state.store.delete(self.key)
                raise
            new = NewFile(file_id=self.file_id, key=self.key, filename=self.filename or "upload.jsonl",
                          purpose=purpose, size=self.size, sha256=self.hasher.hexdigest(), stats=stats)
            return record_files(self.state, self.account.id, [new])[0]

    def abort(self) -> None:
        with self.lock:
            # Closing the writer's context with an exception discards the half-written object.
            self.stack.__exit__(InvalidRequest, InvalidRequest("upload aborted"), None)


async def _drain(body: AsyncIterator[bytes], limit: int) -> bool:
    """Read and drop the rest of the body, up to `limit` bytes; whether it ended (or the client left)."""
    try:
        async for chunk in body:
            limit -= len(chunk)
            if limit < 0:
                return False
    except ClientDisconnect:
        pass
    return True


async def _stream(upload: _Upload, stream: MultipartStream, body: AsyncIterator[bytes]) -> None:
    pending, received = bytearray(), 0
    try:
        async for chunk in body:
            received += len(chunk)
            if received > MAX_BODY_BYTES:
                raise _body_too_large()
            pending += chunk
            if len(pending) >= BATCH_BYTES:
                data, pending = bytes(pending), bytearray()
                await asyncio.to_thread(lambda: upload.feed(stream.feed(data)))
    except ClientDisconnect:
        raise incomplete() from None
    data = bytes(pending)
    await asyncio.to_thread(lambda: upload.feed(stream.feed(data) + stream.finish()))


def _body_too_large(length: int | None = None) -> PayloadTooLarge:
    size = f"is {length:,} bytes" if length is not None and length < BEYOND else "is longer"
    return PayloadTooLarge(
        f"The request body {size}; an upload's body may be at most {MAX_BODY_BYTES:,} bytes (the largest file, "
        f"{max(FILE_BYTES.values()):,} bytes, and 1 MiB for the rest of the form).",
        code="request_too_large", param=None,
    )


async def upload_file(
    state: AppState, account: Account, headers: Mapping[str, str], body: AsyncIterator[bytes]
) -> File:
    """The file a multipart body uploads; a refusal whose body was left unread carries
    `headers = CLOSE_CONNECTION` (the error handler sends them)."""
    length = declared_length(headers.get("content-length"))  # None: chunked
    if length is not None and length > MAX_BODY_BYTES:
        exc = _body_too_large(length)
        exc.headers = CLOSE_CONNECTION
        raise exc
    upload = None
    try:
        stream = MultipartStream(boundary_of(headers.get("content-type")),
                                 max_parts=state.settings.upload_max_form_fields)
        count, used = await asyncio.to_thread(limits.usage, state, account.id)
        limits.check(state.settings, count, used, files=1, nbytes=1)
        upload = _Upload(state, account, used_bytes=used)
        await _stream(upload, stream, body)
        return await asyncio.to_thread(upload.complete)
    except ServiceError as exc:
        if upload is not None:
            await asyncio.to_thread(upload.abort)
        # Read (and drop) some of the rest: a client still sending when the server answers sees a
        # broken connection instead of the refusal, and SDKs retry those. Past the bound, stop.
        if not await _drain(body, state.settings.upload_drain_bytes):
            exc.headers = CLOSE_CONNECTION
        raise
    except BaseException:
        if upload is not None:
            await asyncio.to_thread(upload.abort)
        raise
