"""Rate limits per account (all its API keys together) and a cap on uploads in flight per account, shared by every replica.

Where the counts live: in the metadata database, not in a Ray actor. The app also runs without
Ray (plain uvicorn over `create_app`), every request already opens a database session to look up
its key, and the bucket's upsert rides in that same transaction: one more statement, no extra
connection, commit or process hop (an actor call is a round trip of its own, a single point that
every request of every replica queues on, and its counts vanish when it restarts). The cost per
request is measured by `bench/rate_limits.py` against the same app with limits off: on the
shared 2-core test machine, +0.4 ms of database work per request on SQLite and +1.7 ms on
PostgreSQL, and 64 clients' throughput with limits on within noise of it with them off.

The route dependencies that apply these sit in `serve_app.auth`:
- Every authenticated request takes a token from its account's general bucket
  (`rate_limit_requests_per_second`, `rate_limit_requests_burst`): `current_account`.
- Uploads and job creates also take one from a stricter bucket they share
  (`rate_limit_heavy_per_second`, `rate_limit_heavy_burst`): `heavy_request`.
- Chat completions also take one from their own bucket (`rate_limit_generations_per_second`,
  `rate_limit_generations_burst`), and hold one of the account's `online_generations_per_account`
  generation slots while they generate: `generation_slot` (issue 27).
- An upload holds one of its account's `uploads_in_flight_per_account` slots while its body is
  read: `upload_slot`. The slot is released when the handler ends however it ends (stored,
  refused, client gone, server error); a replica that dies mid-upload stops renewing its lease,
  which then lapses after `upload_slot_lease_seconds`.

Over a limit: 429 `rate_limit_exceeded` (type `rate_limit_error`) with `Retry-After`, so the
openai SDK raises `RateLimitError` with max_retries=0 and otherwise waits that long and retries.
A full set of upload slots is also `rate_limit_exceeded` (waiting, not a lower quota, cures it),
with `error.limit` = {limit: the cap, current: uploads in flight} and a Retry-After of one second
(when another upload ends is unknown). A refused request takes no token; an accepted one is
counted when it arrives, whatever it then answers. A limit set to 0 is off and costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import TYPE_CHECKING, AsyncIterator

from openft.errors import RateLimited
from openft.settings import Settings
from serve_app.state import AppState
from storage import rate_limits as repo
from storage.db import Database
from storage.leases import lock_account

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger("openft.api")
GENERAL, HEAVY, GENERATIONS = "requests", "heavy", "generations"
SLOT_RETRY_AFTER_S = 1.0


def limited(settings: Settings, bucket: str) -> bool:
    return _bucket(settings, bucket)[0] > 0


def take(session: Session, settings: Settings, account_id: str, bucket: str) -> RateLimited | None:
    """Take a token from the account's `bucket`; None if taken, else the 429 to raise once the
    session has committed (a refusal records the refill, and takes nothing)."""
    rate, burst = _bucket(settings, bucket)
    if rate <= 0:
        return None
    wait = repo.take_token(session, account_id, bucket, rate=rate, burst=burst)
    if wait <= 0:
        return None
    what = {GENERAL: "requests", HEAVY: "uploads and fine-tuning job creates", GENERATIONS: "chat completions"}[bucket]
    return RateLimited(f"Rate limit reached for {what}: {rate:g} per second with bursts of {burst} per account. "
                       "Retry after the time in the Retry-After header.", code="rate_limit_exceeded", retry_after=wait)


def _bucket(settings: Settings, bucket: str) -> tuple[float, int]:
    if bucket == GENERAL:
        return settings.rate_limit_requests_per_second, settings.rate_limit_requests_burst
    if bucket == GENERATIONS:
        return settings.rate_limit_generations_per_second, settings.rate_limit_generations_burst
    return settings.rate_limit_heavy_per_second, settings.rate_limit_heavy_burst


@contextlib.asynccontextmanager
async def upload_slot(state: AppState, account_id: str) -> AsyncIterator[None]:
    """Hold one of the account's upload slots for the body of the `async with`, or raise 429."""
    async with _slot(state, account_id, "upload", state.settings.uploads_in_flight_per_account, "uploads in flight"):
        yield


@contextlib.asynccontextmanager
async def generation_slot(state: AppState, account_id: str) -> AsyncIterator[None]:
    """Hold one of the account's generation slots (online chat completions) for the body of the
    `async with`, or raise 429."""
    async with _slot(state, account_id, "generation", state.settings.online_generations_per_account,
                     "chat completions generating"):
        yield


@contextlib.asynccontextmanager
async def _slot(state: AppState, account_id: str, kind: str, cap: int, what: str) -> AsyncIterator[None]:
    lease_s = state.settings.upload_slot_lease_seconds
    if cap <= 0:
        yield
        return
    holder = secrets.token_hex(16)
    in_flight = await asyncio.to_thread(acquire_slot, state.db, account_id, holder, kind=kind, cap=cap, lease_s=lease_s)
    if in_flight >= cap:
        raise RateLimited(f"Your account has {in_flight} {what}, the most it may have at once. "
                          "Retry when one of them has ended.",
                          code="rate_limit_exceeded", limit=cap, current=in_flight, retry_after=SLOT_RETRY_AFTER_S)
    renewer = asyncio.create_task(_renew(state.db, holder, lease_s))
    try:
        yield
    finally:
        renewer.cancel()
        # Shielded: a cancelled request (its client gone) still frees its slot.
        await asyncio.shield(asyncio.to_thread(_release, state.db, holder))


def acquire_slot(db: Database, account_id: str, holder: str, *, kind: str = "upload", cap: int, lease_s: float) -> int:
    """Take a slot of `kind` for `holder` if fewer than `cap` are held; returns how many were held before."""
    with db.session() as session:
        lock_account(session, account_id)  # concurrent acquires of one account count one after another
        return repo.acquire_slot(session, account_id, holder, kind=kind, cap=cap, lease_s=lease_s)


async def _renew(db: Database, holder: str, lease_s: float) -> None:
    def renew() -> bool:
        with db.session() as session:
            return repo.renew_slot(session, holder, lease_s=lease_s)

    while True:
        await asyncio.sleep(lease_s / 3)
        try:
            held = await asyncio.to_thread(renew)
        except Exception as exc:  # a database blip: the next renewal, a third of a lease later, retries
            log.warning("slot renewal failed: %s", type(exc).__name__)
            continue
        if not held:
            log.warning("a slot's lease lapsed before its work ended; the work goes on uncounted")
            return


def _release(db: Database, holder: str) -> None:
    with db.session() as session:
        repo.release_slot(session, holder)
