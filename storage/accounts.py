"""Account repository: creation with a first API key (storage/api_keys.py holds the keys), lookup by
name, and the operator-set limits row."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from openft.ids import new_id, org_id
from storage.api_keys import add_key
from storage.models import Account, AccountLimits

FIRST_KEY_NAME = "default"


def create_account(session: Session, name: str, *, open_jobs_limit: int) -> tuple[Account, str]:
    """Create an account with one key, named `default`; returns it with the key, which is shown once."""
    account_id, now = new_id("acct-", 24), int(time.time())
    account = Account(id=account_id, name=name, org_id=org_id(), retired_key_sha256=f"retired:{account_id}",
                      retired_key_hint="", open_jobs_limit=open_jobs_limit, created_at=now)
    session.add(account)
    session.flush()
    _, key = add_key(session, account.id, FIRST_KEY_NAME, now)
    return account, key


def get_account_by_name(session: Session, name: str) -> Account | None:
    return session.scalar(select(Account).where(Account.name == name))


def limits_row(session: Session, account_id: str) -> AccountLimits:
    """The account's operator-set limits row, created empty on first use (jobs/limits.py reads it)."""
    row = session.get(AccountLimits, account_id)
    if row is None:
        row = AccountLimits(account_id=account_id, open_jobs_set=False)
        session.add(row)
    return row
