"""Per-account file limits: how many live files (`account_max_files`) and how many bytes of them
(`account_max_file_bytes`) one account may hold. The one home of the rule.

Uploads and distillations call `check` before they read a byte (a full account is refused at
once), uploads stop streaming once the file alone would pass the byte limit, and
files/record.py `record_files` calls `check_locked` again under the account's row lock as it
inserts the rows, so that concurrent uploads of one account cannot pass the limit together.
Every live row of the files table counts, whatever wrote it: uploads, distilled files, and job
results files (jobs/registration.py), which are never refused, since their run is already done.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from openft.errors import RateLimited
from openft.settings import Settings
from storage.context import Context
from storage.files import live_usage
from storage.leases import lock_account

_FREE_UP = "Delete files you no longer need (DELETE /v1/files/{file_id}) and try again."


def usage(state: Context, account_id: str) -> tuple[int, int]:
    """(files, bytes) the account holds now, read without a lock."""
    with state.db.session() as session:
        return live_usage(session, account_id, state.now())


def check(settings: Settings, count: int, used: int, *, files: int, nbytes: int) -> None:
    """Refuses adding `files` files of `nbytes` bytes to an account holding `count` files of `used` bytes."""
    if count + files > settings.account_max_files:
        raise RateLimited(
            f"Your account holds {count:,} files and may hold {settings.account_max_files:,}. {_FREE_UP}",
            limit=settings.account_max_files, current=count, param="file",
        )
    if used + nbytes > settings.account_max_file_bytes:
        raise over_bytes(settings, used)


def over_bytes(settings: Settings, used: int) -> RateLimited:
    return RateLimited(
        f"Your account's files take {used:,} bytes and may take {settings.account_max_file_bytes:,}; this file "
        f"would go past that. {_FREE_UP}",
        limit=settings.account_max_file_bytes, current=used, param="file",
    )


def check_locked(session: Session, settings: Settings, account_id: str, now: int, *, files: int, nbytes: int) -> None:
    """`check` under the account's row lock (PostgreSQL; SQLite: BEGIN IMMEDIATE), held by the
    caller's transaction until its rows are inserted."""
    lock_account(session, account_id)
    count, used = live_usage(session, account_id, now)
    check(settings, count, used, files=files, nbytes=nbytes)
