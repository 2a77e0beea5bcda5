"""Repository of evals: one account's rows only; another account's id reads as none."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import paging
from storage.models import Eval


def get_eval(session: Session, account_id: str, eval_id: str) -> Eval | None:
    return session.scalar(select(Eval).where(Eval.id == eval_id, Eval.account_id == account_id))


def list_evals(session: Session, account_id: str, *, limit: int, after: str | None, order: str,
               order_by: str) -> tuple[Sequence[Eval], bool]:
    """One page ordered by (created_ns or updated_ns, id); `after` is the last id of the previous page."""
    query = select(Eval).where(Eval.account_id == account_id)
    cursor = get_eval(session, account_id, after) if after else None
    return paging.page(session, query, Eval, cursor, limit, descending=order == "desc",
                       key="created_ns" if order_by == "created_at" else "updated_ns")
