"""Repository of evals: one account's rows only; another account's id reads as none."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Eval


def get_eval(session: Session, account_id: str, eval_id: str) -> Eval | None:
    return session.scalar(select(Eval).where(Eval.id == eval_id, Eval.account_id == account_id))


def list_evals(session: Session, account_id: str, *, limit: int, after: str | None, order: str,
               order_by: str) -> tuple[Sequence[Eval], bool]:
    """One page ordered by (created_ns or updated_ns, id); `after` is the last id of the previous page."""
    key = Eval.created_ns if order_by == "created_at" else Eval.updated_ns
    query = select(Eval).where(Eval.account_id == account_id)
    if after:
        cursor = get_eval(session, account_id, after)
        if cursor is not None:
            at = cursor.created_ns if order_by == "created_at" else cursor.updated_ns
            if order == "desc":
                query = query.where((key < at) | ((key == at) & (Eval.id < cursor.id)))
            else:
                query = query.where((key > at) | ((key == at) & (Eval.id > cursor.id)))
    ordering = (key.desc(), Eval.id.desc()) if order == "desc" else (key.asc(), Eval.id.asc())
    rows = session.scalars(query.order_by(*ordering).limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit
