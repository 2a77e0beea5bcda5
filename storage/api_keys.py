"""API key repository: a new key (shown once, stored as its SHA-256), the lookup that authenticates
a request, last use, the owner's keys page by page, and revocation. What a key may do, and when
it no longer works, is serve_app/services/api_keys.py's."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from openft.ids import new_id
from storage import paging
from storage.models import Account, ApiKey

KEY_PREFIX = "sk-openft-"
# last_used_at is written when it is older than this: "last used" to the minute, for a write a
# minute per busy key instead of one per request.
TOUCH_EVERY_S = 60


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def add_key(session: Session, account_id: str, name: str, now: int, *, expires_at: int | None = None) -> tuple[ApiKey, str]:
    """A new key of the account; returns its row and the key itself, which is never stored."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(id=new_id("key_", 24), account_id=account_id, name=name, sha256=key_digest(key),
                 redacted_value=f"{KEY_PREFIX}...{key[-4:]}", created_at=now, created_ns=time.time_ns(),
                 expires_at=expires_at)
    session.add(row)
    session.flush()
    return row, key


def lookup(session: Session, key: str) -> tuple[ApiKey, Account] | None:
    """The key's row and its account, revoked or expired ones included (the caller decides)."""
    digest = key_digest(key)
    found = session.execute(select(ApiKey, Account).join(Account, Account.id == ApiKey.account_id)
                            .where(ApiKey.sha256 == digest)).first()
    # The index seek already matched; compare in constant time anyway so that no code path's
    # timing depends on how much of a guessed key is right.
    if found is None or not hmac.compare_digest(found[0].sha256, digest):
        return None
    return found[0], found[1]


def touch(session: Session, row: ApiKey, now: int) -> None:
    """Record a use, when the recorded one is older than TOUCH_EVERY_S (compare-and-set: of two
    replicas at once, one writes)."""
    if row.last_used_at is not None and now - row.last_used_at < TOUCH_EVERY_S:
        return
    session.execute(update(ApiKey).where(
        ApiKey.id == row.id, ApiKey.last_used_at.is_(None) | (ApiKey.last_used_at <= now - TOUCH_EVERY_S))
        .values(last_used_at=now))


def get_key(session: Session, account_id: str, key_id: str) -> ApiKey | None:
    """The account's key, unless revoked."""
    return session.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.account_id == account_id,
                                               ApiKey.revoked_at.is_(None)))


def list_keys(session: Session, account_id: str, *, limit: int, after: str | None) -> tuple[Sequence[ApiKey], bool]:
    """The account's keys that are not revoked, newest first; `after` is the last id of the previous page."""
    query = select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None))
    cursor = session.scalar(query.where(ApiKey.id == after)) if after else None
    return paging.page(session, query, ApiKey, cursor, limit)


def count_keys(session: Session, account_id: str, now: int) -> int:
    """The account's keys that still work (not revoked, not expired)."""
    rows = session.scalars(select(ApiKey.expires_at).where(ApiKey.account_id == account_id,
                                                           ApiKey.revoked_at.is_(None))).all()
    return sum(1 for expires_at in rows if expires_at is None or expires_at > now)


def revoke(session: Session, row: ApiKey, now: int) -> bool:
    """Revoke the key (compare-and-set); False when it already was."""
    done = session.execute(update(ApiKey).where(ApiKey.id == row.id, ApiKey.revoked_at.is_(None))
                           .values(revoked_at=now))
    return done.rowcount == 1
