"""File repository: the `files` table. Visibility rules (owner, not deleted) live here once."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from storage import paging
from storage.models import File


def add_file(session: Session, file: File) -> File:
    session.add(file)
    session.flush()
    return file


def live_usage(session: Session, account_id: str, now: int) -> tuple[int, int]:
    """(files, bytes) an account holds toward its file limits: every purpose, not deleted, not
    expired (an expired file counts no more, though the reaper may not have deleted it yet)."""
    count, total = session.execute(
        select(func.count(), func.coalesce(func.sum(File.bytes), 0)).where(
            File.account_id == account_id, File.deleted_at.is_(None),
            or_(File.expires_at.is_(None), File.expires_at > now),
        )
    ).one()
    return int(count), int(total)


def get_file(session: Session, account_id: str, file_id: str, *, for_update: bool = False) -> File | None:
    query = select(File).where(File.id == file_id, File.account_id == account_id, File.deleted_at.is_(None))
    if for_update:
        query = query.with_for_update()
    return session.scalar(query)


def list_files(
    session: Session, account_id: str, *, purpose: str | None, limit: int, after: str | None, order: str
) -> tuple[Sequence[File], bool]:
    """One page, ordered by (created_ns, id); `after` is the id of the last file of the previous page."""
    query = select(File).where(File.account_id == account_id, File.deleted_at.is_(None))
    if purpose:
        query = query.where(File.purpose == purpose)
    cursor = get_file(session, account_id, after) if after else None
    return paging.page(session, query, File, cursor, limit, descending=order == "desc")


def expired_files(session: Session, now: int, limit: int = 1000) -> Sequence[File]:
    return session.scalars(
        select(File).where(File.deleted_at.is_(None), File.expires_at.is_not(None), File.expires_at <= now).limit(limit)
    ).all()


def files_by_id(session: Session, file_ids: list[str | None]) -> dict[str, File]:
    """The rows of `file_ids` (any account's; None entries skipped), by id."""
    wanted = [file_id for file_id in file_ids if file_id]
    return {row.id: row for row in session.scalars(select(File).where(File.id.in_(wanted)))} if wanted else {}
