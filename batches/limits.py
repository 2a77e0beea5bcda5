"""An account's open-batch limit (the reference's "2 open batches" for a new account).

Where it sits: batch create (serve_app/services/batches.py) calls `check_open_batches` once to fail
fast and again under the account's lock (storage/leases.py `lock_account`) before it adds the
row, so two concurrent creates at the limit cannot both pass: on PostgreSQL the second waits for
the first's row lock and then counts its batch; on SQLite `BEGIN IMMEDIATE` serialises them.
Open: validating, in_progress, finalizing and cancelling.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from openft.errors import RateLimited
from openft.settings import Settings
from storage.batches import count_open


def open_batches_limit(settings: Settings) -> int:
    return settings.new_account_open_batches


def check_open_batches(session: Session, account_id: str, settings: Settings) -> None:
    limit, current = open_batches_limit(settings), count_open(session, account_id)
    if current >= limit:
        raise RateLimited(
            f"Your account can have {limit} open batch(es) and has {current}. Retry after a batch ends, or cancel one.",
            limit=limit, current=current,
        )
