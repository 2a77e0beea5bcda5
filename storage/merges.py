"""Merge repository: the `merges` table. Which row the API shows, what counts against an account's
limits, and what the background worker picks up, expires and still owes a storage delete."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.models import Merge

IN_PROGRESS = ("queued", "running")


def latest_merge(session: Session, account_id: str, model: str) -> Merge | None:
    """The account's newest merge of `model` that is not deleted: the one the API shows."""
    query = (
        select(Merge)
        .where(Merge.account_id == account_id, Merge.model == model, Merge.deleted_at.is_(None))
        .order_by(Merge.created_ns.desc(), Merge.id.desc())
        .limit(1)
    )
    return session.scalar(query)


def visible_merges(session: Session, account_id: str, model: str) -> Sequence[Merge]:
    """Every merge of `model` that is not deleted, newest first (a DELETE deletes them all)."""
    return session.scalars(
        select(Merge)
        .where(Merge.account_id == account_id, Merge.model == model, Merge.deleted_at.is_(None))
        .order_by(Merge.created_ns.desc(), Merge.id.desc())
        .with_for_update()
    ).all()


def delete_model_merges(session: Session, account_id: str, model: str, now: int) -> list[tuple[str, str]]:
    """A deleted model takes its merges with it: pending ones are cancelled, a running one deletes
    what it wrote when it ends (`merge_weights_gone`), exports are marked deleted. Returns the
    `(merge id, export prefix)` of the exports whose objects are owed a delete."""
    rows = visible_merges(session, account_id, model)
    for row in rows:
        if row.status == "running":
            row.delete_requested = True
        else:
            row.deleted_at = now
    return [(row.id, row.export_prefix) for row in rows if row.status == "succeeded"]


def get_merge(session: Session, merge_id: str, *, for_update: bool = False) -> Merge | None:
    query = select(Merge).where(Merge.id == merge_id)
    if for_update:
        query = query.with_for_update()
    return session.scalar(query)


def count_in_progress(session: Session, account_id: str) -> int:
    return session.scalar(
        select(func.count()).select_from(Merge).where(
            Merge.account_id == account_id, Merge.status.in_(IN_PROGRESS), Merge.deleted_at.is_(None)
        )
    )


def count_created_since(session: Session, account_id: str, since: int) -> int:
    """Every accepted merge counts, whatever became of it."""
    return session.scalar(
        select(func.count()).select_from(Merge).where(Merge.account_id == account_id, Merge.created_at >= since)
    )


def held_exports(session: Session, account_id: str, now: int) -> tuple[int, int]:
    """(exports, bytes) the account keeps: succeeded, not expired (even if not yet marked), not deleted."""
    query = select(func.count(), func.coalesce(func.sum(Merge.bytes), 0)).where(
        Merge.account_id == account_id, Merge.status == "succeeded", Merge.deleted_at.is_(None), Merge.expires_at > now
    )
    count, total = session.execute(query).one()
    return int(count), int(total)


def queued_merge_ids(session: Session) -> Sequence[str]:
    """Oldest first, so each account's merges run in the order they were asked for (each is claimed
    under its account's lock, which re-reads it: a DELETE that cancelled it meanwhile is seen)."""
    return session.scalars(
        select(Merge.id).where(Merge.status == "queued", Merge.deleted_at.is_(None)).order_by(Merge.created_ns, Merge.id)
    ).all()


def running_merges(session: Session, account_id: str) -> Sequence[Merge]:
    return session.scalars(select(Merge).where(Merge.account_id == account_id, Merge.status == "running")).all()


def expired_exports(session: Session, now: int) -> Sequence[Merge]:
    return session.scalars(
        select(Merge).where(Merge.status == "succeeded", Merge.deleted_at.is_(None), Merge.expires_at <= now)
    ).all()


def unpurged_exports(session: Session) -> Sequence[Merge]:
    """Deleted or expired exports whose objects a failed storage delete left behind."""
    gone = (Merge.status == "expired") | ((Merge.status == "succeeded") & Merge.deleted_at.is_not(None))
    return session.scalars(select(Merge).where(gone, Merge.purged_at.is_(None))).all()
