"""Account repository: creation with a fresh API key, and key lookup for authentication."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from openft.ids import new_id, org_id
from storage.models import Account, AccountLimits

KEY_PREFIX = "sk-openft-"


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_account(session: Session, name: str, *, open_jobs_limit: int) -> tuple[Account, str]:
    """Create an account; returns it with its API key, which is shown once and stored hashed."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    account = Account(
        id=new_id("acct-", 24),
        name=name,
        org_id=org_id(),
        key_sha256=_key_digest(key),
        key_hint=key[-4:],
        open_jobs_limit=open_jobs_limit,
        created_at=int(time.time()),
    )
    session.add(account)
    session.flush()
    return account, key


def account_for_key(session: Session, key: str) -> Account | None:
    digest = _key_digest(key)
    account = session.scalar(select(Account).where(Account.key_sha256 == digest))
    # The index seek already matched; compare in constant time anyway so that no code path's
    # timing depends on how much of a guessed key is right.
    if account is None or not hmac.compare_digest(account.key_sha256, digest):
        return None
    return account


def get_account_by_name(session: Session, name: str) -> Account | None:
    return session.scalar(select(Account).where(Account.name == name))


def limits_row(session: Session, account_id: str) -> AccountLimits:
    """The account's operator-set limits row, created empty on first use (jobs/limits.py reads it)."""
    row = session.get(AccountLimits, account_id)
    if row is None:
        row = AccountLimits(account_id=account_id, open_jobs_set=False)
        session.add(row)
    return row
