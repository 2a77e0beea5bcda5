"""Repository of evals, their runs and the runs' output items: one account's rows only; another
account's id reads as none. A run's status is evals/transitions.py's to write."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from storage import paging
from storage.models import Eval, EvalOutputItem, EvalRun

RUN_OPEN = ("queued", "in_progress")
RUN_ENDED = ("completed", "failed", "canceled")


def get_eval(session: Session, account_id: str, eval_id: str) -> Eval | None:
    return session.scalar(select(Eval).where(Eval.id == eval_id, Eval.account_id == account_id))


def list_evals(session: Session, account_id: str, *, limit: int, after: str | None, order: str,
               order_by: str) -> tuple[Sequence[Eval], bool]:
    """One page ordered by (created_ns or updated_ns, id); `after` is the last id of the previous page."""
    query = select(Eval).where(Eval.account_id == account_id)
    cursor = get_eval(session, account_id, after) if after else None
    return paging.page(session, query, Eval, cursor, limit, descending=order == "desc",
                       key="created_ns" if order_by == "created_at" else "updated_ns")


def get_run(session: Session, account_id: str, eval_id: str, run_id: str) -> EvalRun | None:
    return session.scalar(select(EvalRun).where(EvalRun.id == run_id, EvalRun.eval_id == eval_id,
                                                EvalRun.account_id == account_id))


def list_runs(session: Session, account_id: str, eval_id: str, *, limit: int, after: str | None, order: str,
              status: str | None) -> tuple[Sequence[EvalRun], bool]:
    query = select(EvalRun).where(EvalRun.account_id == account_id, EvalRun.eval_id == eval_id)
    if status is not None:
        query = query.where(EvalRun.status == status)
    cursor = get_run(session, account_id, eval_id, after) if after else None
    return paging.page(session, query, EvalRun, cursor, limit, descending=order == "desc")


def get_item(session: Session, account_id: str, run_id: str, item_id: str) -> EvalOutputItem | None:
    return session.scalar(select(EvalOutputItem).where(EvalOutputItem.id == item_id, EvalOutputItem.run_id == run_id,
                                                       EvalOutputItem.account_id == account_id))


def list_items(session: Session, account_id: str, run_id: str, *, limit: int, after: str | None, order: str,
               status: str | None) -> tuple[Sequence[EvalOutputItem], bool]:
    query = select(EvalOutputItem).where(EvalOutputItem.account_id == account_id, EvalOutputItem.run_id == run_id)
    if status is not None:
        query = query.where(EvalOutputItem.status == status)
    cursor = get_item(session, account_id, run_id, after) if after else None
    return paging.page(session, query, EvalOutputItem, cursor, limit, descending=order == "desc")


def all_items(session: Session, run_id: str) -> Sequence[EvalOutputItem]:
    """A run's items in item order (the comparison of two runs reads them whole)."""
    return session.scalars(select(EvalOutputItem).where(EvalOutputItem.run_id == run_id)
                           .order_by(EvalOutputItem.item_index)).all()


def item_indices(session: Session, run_id: str) -> set[int]:
    """The items a run recorded already (a driver that runs again after a lost one skips them)."""
    return set(session.scalars(select(EvalOutputItem.item_index).where(EvalOutputItem.run_id == run_id)))


def delete_run_rows(session: Session, run: EvalRun) -> None:
    session.execute(delete(EvalOutputItem).where(EvalOutputItem.run_id == run.id))
    session.delete(run)


def count_leased_runs(session: Session) -> int:
    """Runs a driver holds (each may hold a batch's engine actors on the cluster)."""
    return session.scalar(select(func.count()).select_from(EvalRun).where(EvalRun.lease_owner.is_not(None)))


def waiting_runs(session: Session, limit: int) -> Sequence[str]:
    """Queued runs no driver holds, oldest first."""
    return session.scalars(select(EvalRun.id).where(EvalRun.lease_owner.is_(None), EvalRun.status == "queued")
                           .order_by(EvalRun.created_ns).limit(limit)).all()


def run_status(session: Session, run_id: str) -> str | None:
    return session.scalar(select(EvalRun.status).where(EvalRun.id == run_id))


def expired_runs(session: Session, now: int, *, limit: int) -> Sequence[EvalRun]:
    """Ended runs past their retention (their items, samples and grades go with them)."""
    return session.scalars(select(EvalRun).where(EvalRun.status.in_(RUN_ENDED), EvalRun.expires_at <= now)
                           .order_by(EvalRun.expires_at).limit(limit)).all()


def run_ids_of(session: Session, account_id: str, eval_id: str) -> Sequence[str]:
    return session.scalars(select(EvalRun.id).where(EvalRun.account_id == account_id, EvalRun.eval_id == eval_id)).all()
