"""The deliverer: claims due deliveries from the outbox under a lease, POSTs each signed, and
records the attempt; the controller runs one on a thread of its own (`start_deliverer`).

An attempt succeeds on any 2xx answer. Anything else (another status, a redirect, which is never
followed, a timeout, a refused connection) is retried after an exponential backoff
(`webhook_backoff_seconds` doubling up to `webhook_backoff_max_seconds`, plus up to
`webhook_backoff_jitter` of it at random, never less), until the next try would fall past
`webhook_retry_window_seconds` from the event: then the delivery is `failed`. The webhook-id is
the event's id on every attempt, so a receiver can drop the duplicates a lapsed lease or a lost
answer may cause. Several deliverers may share a database: the claim is a compare-and-set
(storage/webhooks.py `claim_due`), and a deliverer whose lease lapsed records nothing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from openft.settings import Settings
from storage import webhooks as repo
from storage.db import Database
from webhooks import signing

log = logging.getLogger("openft.webhooks")


@dataclass(frozen=True)
class Answer:
    """What one POST got: the status code, or the transport error (`timeout`, `connection_error`)."""

    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def post(url: str, keys: tuple[str, ...], msg_id: str, body: str, *, timeout_s: float) -> Answer:
    """One signed POST. The answer's body is never read (a receiver could send gigabytes), redirects
    are not followed, and no proxy is taken from the environment."""
    headers = signing.headers(keys, msg_id, int(time.time()), body)
    started = time.monotonic()
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
            with client.stream("POST", url, content=body.encode(), headers=headers) as response:
                code = response.status_code
        return Answer(code, None if 200 <= code < 300 else "http_status", _ms(started))
    except httpx.TimeoutException:
        return Answer(None, "timeout", _ms(started))
    except httpx.HTTPError:  # refused, reset, DNS, TLS: the endpoint did not answer
        return Answer(None, "connection_error", _ms(started))


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def backoff(settings: Settings, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 is the first)."""
    base = min(settings.webhook_backoff_seconds * 2 ** (attempt - 1), settings.webhook_backoff_max_seconds)
    return base * (1 + settings.webhook_backoff_jitter * (rng or random).random())


def attempt(db: Database, settings: Settings, due: repo.Due, owner: str) -> Answer:
    """POST one claimed delivery and record what it got (delivered, retried later or failed)."""
    started_at = time.time()
    answer = post(due.url, due.secrets, due.event_id, due.payload, timeout_s=settings.webhook_timeout_seconds)
    now = time.time()
    if answer.ok:
        status, next_at = "delivered", None
    else:
        next_at = now + backoff(settings, due.attempt)
        if next_at > due.created_at + settings.webhook_retry_window_seconds:
            status, next_at = "failed", None
        else:
            status = "pending"

    def record() -> bool:
        with db.session() as session:
            return repo.record_attempt(session, due, owner, started_at=started_at, duration_ms=answer.duration_ms,
                                       status_code=answer.status_code, error=answer.error, status=status,
                                       next_attempt_at=next_at, now=now)

    if not db.retrying(record, budget_s=settings.db_outage_seconds, what="record a webhook attempt"):
        log.warning("webhook delivery %s: the lease lapsed before its attempt was recorded", due.delivery_id)
    return answer


def deliver_due(db: Database, settings: Settings, owner: str, pool: ThreadPoolExecutor | None = None) -> list[str]:
    """One round: claim up to `webhook_concurrency` due deliveries and attempt them at once; returns
    the ids attempted."""
    with db.session() as session:
        claimed = repo.claim_due(session, time.time(), owner=owner, lease_s=settings.webhook_lease_seconds,
                                 limit=settings.webhook_concurrency)
    if pool is None or len(claimed) <= 1:
        for due in claimed:
            attempt(db, settings, due, owner)
    else:
        list(pool.map(lambda due: attempt(db, settings, due, owner), claimed))
    return [due.delivery_id for due in claimed]


def run_deliverer(db: Database, settings: Settings, owner: str, stop: threading.Event) -> None:
    """Rounds until `stop` is set: at once again while there was work, else after `webhook_poll_seconds`."""
    with ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="webhook") as pool:
        while not stop.is_set():
            try:
                busy = bool(deliver_due(db, settings, owner, pool))
            except Exception as exc:  # the database is down: the next round retries; claims lapse meanwhile
                log.error("webhook delivery round failed: %s", type(exc).__name__)
                busy = False
            if not busy:
                stop.wait(settings.webhook_poll_seconds)


def start_deliverer(db: Database, settings: Settings, owner: str, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=run_deliverer, args=(db, settings, owner, stop), name="webhook-deliverer",
                              daemon=True)
    thread.start()
    return thread
