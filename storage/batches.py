"""Batch repository: the `batches` table. Visibility (the owner's rows only) lives here once;
every status change is batches/transitions.py's."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import paging
from storage.models import Batch

OPEN_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
ENDED_STATUSES = ("failed", "completed", "expired", "cancelled")


def get_batch(session: Session, account_id: str, batch_id: str) -> Batch | None:
    return session.scalar(select(Batch).where(Batch.id == batch_id, Batch.account_id == account_id))


def count_open(session: Session, account_id: str) -> int:
    return session.scalar(select(func.count()).select_from(Batch).where(
        Batch.account_id == account_id, Batch.status.in_(OPEN_STATUSES)))


def list_batches(session: Session, account_id: str, *, limit: int, after: str | None) -> tuple[Sequence[Batch], bool]:
    """Newest first; `after` is the id of the last batch of the previous page."""
    cursor = get_batch(session, account_id, after) if after else None
    return paging.page(session, select(Batch).where(Batch.account_id == account_id), Batch, cursor, limit)


def batch_for_output(session: Session, account_id: str, file_id: str) -> Batch | None:
    """The caller's batch whose output file this is (the distill shortcut reads its input file)."""
    return session.scalar(select(Batch).where(Batch.account_id == account_id, Batch.output_file_id == file_id))


def file_in_open_batch(session: Session, file_id: str) -> bool:
    """An open batch reads its input file: it cannot be deleted until the batch ends."""
    return session.scalar(select(func.count()).select_from(Batch).where(
        Batch.input_file_id == file_id, Batch.status.in_(OPEN_STATUSES))) > 0


def count_leased(session: Session) -> int:
    """Batches a driver holds (each holds its engine actors' resources on the cluster)."""
    return session.scalar(select(func.count()).select_from(Batch).where(Batch.lease_owner.is_not(None)))
