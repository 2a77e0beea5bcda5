"""Files: list, retrieve, content and delete, each scoped to the caller's account."""

from __future__ import annotations

from typing import Callable, Iterator

from openft.errors import Conflict, InvalidRequest, NotFound
from serve_app.schemas.common import Page
from serve_app.schemas.files import FileDeleted, FileGridline, FileObject
from serve_app.services.paging import check_limit
from serve_app.state import AppState
from storage import files as files_repo
from storage.models import Account, File


def file_object(row: File) -> FileObject:
    stats = row.stats or {}
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        expires_at=row.expires_at,
        filename=row.filename,
        purpose=row.purpose,
        status=row.status,
        gridline=FileGridline(sha256=row.sha256, derived_from=row.derived_from, **stats),
    )


def _not_found(file_id: str) -> NotFound:
    return NotFound("No such file.", param="file_id")


def get_file_row(state: AppState, account: Account, file_id: str) -> File:
    with state.db.session() as session:
        row = files_repo.get_file(session, account.id, file_id)
    if row is None:
        raise _not_found(file_id)
    return row


def retrieve_file(state: AppState, account: Account, file_id: str) -> FileObject:
    return file_object(get_file_row(state, account, file_id))


def list_files(
    state: AppState, account: Account, *, purpose: str | None, limit: int, after: str | None, order: str
) -> Page[FileObject]:
    check_limit(limit, 10_000)
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be asc or desc.", code="invalid_value", param="order")
    with state.db.session() as session:
        rows, has_more = files_repo.list_files(
            session, account.id, purpose=purpose, limit=limit, after=after, order=order
        )
    data = [file_object(r) for r in rows]
    return Page[FileObject](
        data=data, has_more=has_more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


def file_content(state: AppState, account: Account, file_id: str) -> tuple[File, Iterator[bytes]]:
    row = get_file_row(state, account, file_id)
    return row, state.store.iter_chunks(row.object_key)


def delete_file(
    state: AppState, account: Account, file_id: str, *, in_use: Callable[[object, str], bool] | None = None
) -> FileDeleted:
    """Delete the row first (the DB is the source of truth), then the object.

    `in_use(session, file_id)` says whether a running job reads the file: such a file stays.
    """
    with state.db.session() as session:
        row = files_repo.get_file(session, account.id, file_id, for_update=True)
        if row is None:
            raise _not_found(file_id)
        if in_use is not None and in_use(session, file_id):
            raise Conflict(
                "This file is used by a running fine-tuning job; delete it after the job ends.",
                code="file_in_use", param="file_id",
            )
        row.deleted_at = state.now()
        key = row.object_key
    state.store.delete(key)
    return FileDeleted(id=file_id, deleted=True)
