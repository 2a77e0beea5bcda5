"""Keyset paging, the one way every list is paged: rows in a total order of (`created_ns`, `id`) (or
another nanosecond key), and a page after a cursor row is the rows past that row's key, never an
OFFSET (a page stays right while rows are added, and costs an index seek however deep it is).

Where it sits: the repositories' list functions (storage/files.py, jobs.py, batches.py,
webhooks.py) build their query and call `page`; the API's `limit` rule and page shape are
serve_app/services/paging.py's."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import Select
from sqlalchemy.orm import Session


def after(query: Select, model, cursor, *, descending: bool = True, key: str = "created_ns") -> Select:
    """`query` ordered by (`key`, id), restricted to the rows after the row `cursor` (None: from the
    start). `key` is a nanosecond column of `model` (`created_ns`; `updated_ns` for a list by update)."""
    ns, row_id = getattr(model, key), model.id
    if cursor is not None:
        at = getattr(cursor, key)
        if descending:
            query = query.where((ns < at) | ((ns == at) & (row_id < cursor.id)))
        else:
            query = query.where((ns > at) | ((ns == at) & (row_id > cursor.id)))
    return query.order_by(*((ns.desc(), row_id.desc()) if descending else (ns.asc(), row_id.asc())))


def first(session: Session, query: Select, limit: int) -> tuple[Sequence, bool]:
    """The first `limit` rows of an ordered `query`, and whether more follow."""
    rows = session.scalars(query.limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit


def page(session: Session, query: Select, model, cursor, limit: int, *, descending: bool = True,
         key: str = "created_ns") -> tuple[Sequence, bool]:
    """One page of `query` in (`key`, id) order after the row `cursor`, and whether more follow."""
    return first(session, after(query, model, cursor, descending=descending, key=key), limit)
