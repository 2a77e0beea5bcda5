"""API keys (issue 24): an account holds several, each with a name, a creation time, a last-used
time and an optional expiry. The account lists, creates and revokes its own (its key authenticates
it; another account's key id answers 404), and the operator any account's (the admin API and
`openft accounts keys`). A key is shown in full once, at create; lists show `sk-openft-...` and its
last 4 characters, and only its SHA-256 is stored.

Which key admits a request (`authenticate`): one that exists, is not revoked and has not expired.
Every request reads its key from the database (one index seek, in the session that takes the
rate-limit bucket), with no cache, so a revocation or an expiry holds on every replica from the
revoke's commit, or the expiry's second, on.
"""

from __future__ import annotations

from jobs.transitions import lock_account
from openft.errors import NotFound, RateLimited, Unauthorized
from openft.settings import Settings
from serve_app.schemas.api_keys import ApiKey, ApiKeyCreateRequest, ApiKeyDeleted, ApiKeyWithValue
from serve_app.schemas.common import Page
from serve_app.services.billing import find_account
from serve_app.services.paging import check_limit, page_of
from storage import api_keys as repo
from storage.db import Database
from storage.models import Account
from storage.models import ApiKey as KeyRow

# No key of ours is longer (`sk-openft-` and 43 characters): a longer one is refused unread.
MAX_KEY_CHARS = 128


def authenticate(session, key: str, now: int) -> Account:
    """The account whose working key `key` is; 401 invalid_api_key otherwise (unknown and revoked
    keys alike)."""
    found = repo.lookup(session, key) if len(key) <= MAX_KEY_CHARS else None
    if found is None or found[0].revoked_at is not None:
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
    row, account = found
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized("This API key has expired; use another key of the account, or have one created.",
                           code="invalid_api_key")
    repo.touch(session, row, now)
    return account


def key_object(row: KeyRow) -> ApiKey:
    return ApiKey(id=row.id, name=row.name, redacted_value=row.redacted_value, created_at=row.created_at,
                  last_used_at=row.last_used_at, expires_at=row.expires_at)


def account_id_of(db: Database, ref: str) -> str:
    """The operator's name for an account (its id or name) as its id; 404 when there is none."""
    with db.session() as session:
        return find_account(session, ref).id


def list_keys(db: Database, account_id: str, *, limit: int, after: str | None) -> Page[ApiKey]:
    check_limit(limit, 100)
    with db.session() as session:
        rows, has_more = repo.list_keys(session, account_id, limit=limit, after=after)
        return page_of([key_object(r) for r in rows], has_more)


def create_key(db: Database, settings: Settings, account_id: str, body: ApiKeyCreateRequest, now: int) -> ApiKeyWithValue:
    """A new key; 429 limit_exceeded when the account already has `api_keys_per_account` working ones,
    counted under the account's lock so that two creates at the limit cannot both pass."""
    limit = settings.api_keys_per_account
    with db.session() as session:
        lock_account(session, account_id)
        current = repo.count_keys(session, account_id, now)
        if current >= limit:
            raise RateLimited(f"This account has {current} API keys, the most it may have ({limit}); revoke one "
                              "first.", limit=limit, current=current, param=None)
        expires_at = None if body.expires_in_seconds is None else now + body.expires_in_seconds
        row, key = repo.add_key(session, account_id, body.name, now, expires_at=expires_at)
        return ApiKeyWithValue(**key_object(row).model_dump(), value=key)


def _owned(session, account_id: str, key_id: str) -> KeyRow:
    row = repo.get_key(session, account_id, key_id)
    if row is None:
        raise NotFound("No such API key.", param="key_id")
    return row


def retrieve_key(db: Database, account_id: str, key_id: str) -> ApiKey:
    with db.session() as session:
        return key_object(_owned(session, account_id, key_id))


def revoke_key(db: Database, account_id: str, key_id: str, now: int) -> ApiKeyDeleted:
    """The key answers 401 from this commit on, on every replica; a revoked key is gone from lists
    and answers 404 here again (its row stays, for the record)."""
    with db.session() as session:
        if not repo.revoke(session, _owned(session, account_id, key_id), now):
            raise NotFound("No such API key.", param="key_id")
    return ApiKeyDeleted(id=key_id, deleted=True)
