"""The deliverer: claims due deliveries from the outbox under a lease, POSTs each signed, and
records the attempt; the controller runs one on a thread of its own (`start_deliverer`).

An attempt succeeds on any 2xx answer. Anything else (another status, a redirect, which is never
followed, a timeout, a refused connection, a refused address) is retried after an exponential
backoff (`webhook_backoff_seconds` doubling up to `webhook_backoff_max_seconds`, plus up to
`webhook_backoff_jitter` of it at random, never less), until the next try would fall past
`webhook_retry_window_seconds` from the event: then the delivery is `failed`. The webhook-id is
the event's id on every attempt, so a receiver can drop the duplicates a lapsed lease or a lost
answer may cause. Several deliverers may share a database: the claim is a compare-and-set
(storage/webhooks.py `claim_due`), and a deliverer whose lease lapsed records nothing.

No receiver can slow another account's deliveries (issue 24):
- `post` has one deadline for the whole attempt (`webhook_timeout_seconds`: name lookup, connect,
  TLS, the request and the answer's status line and headers together), not one per read: a
  receiver that trickles its headers a byte at a time is cut off at the deadline like one that
  never answers.
- The deliverer keeps up to `webhook_concurrency` attempts in flight and claims more as soon as
  one ends; it never waits for a round to finish. An endpoint has at most
  `webhook_endpoint_concurrency` of them, counted by the URL's origin (scheme, host, port:
  `turn_key`), so that one receiver registered under many paths or query strings still gets one
  endpoint's turns: what it claims past that waits for the endpoint's turn,
  as long as its lease leaves time for a whole attempt; what would not is left to lapse and is
  claimed again later, so a slow endpoint's backlog never holds the pool.
- An attempt whose answer comes after its lease lapsed is recorded `lost` (with the status it
  got), never `delivered`: another deliverer may have taken the delivery meanwhile, so it is
  retried under the same webhook-id.

The address rule (webhooks/targets.py) is checked on the address `post` connects to: it resolves
the host once, checks that address and connects to it (the Host header and TLS name stay the
URL's), so a name that resolves or re-resolves to a refused address is refused (`address_refused`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import socket
import ssl
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from ipaddress import ip_address
from urllib.parse import urlsplit

import httpx

from openft.settings import Settings
from storage import webhooks as repo
from storage.db import Database
from webhooks import signing, targets
from webhooks.secrets import SecretBox, SecretUnreadable

log = logging.getLogger("openft.webhooks")


@dataclass(frozen=True)
class Answer:
    """What one POST got: the status code, or why there is none (`timeout`, `connection_error`,
    `address_refused`, `secret_unreadable`); `lost` when the answer came after the lease lapsed."""

    status_code: int | None
    error: str | None
    duration_ms: int
    refused: str | None = None  # for address_refused: what the address is ("a loopback address")

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


async def _resolve(host: str, port: int) -> targets.Address:
    """The address a connection to `host` goes to: the literal, else the lookup's first answer."""
    literal = targets.literal_addresses(host)
    if literal:
        return literal[0]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return ip_address(infos[0][4][0])


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context (certifi's roots) for every POST: loading it takes longer than a refused
    connection, so it is made once, outside any attempt's deadline."""
    return httpx.create_ssl_context()


async def _send(client: httpx.AsyncClient, url: str, keys: tuple[str, ...], msg_id: str, body: str,
                allowed: Sequence) -> tuple[int | None, str | None, str | None]:  # fmt: skip
    target = httpx.URL(url)
    port = target.port or (443 if target.scheme == "https" else 80)
    address = await _resolve(target.host, port)
    why = targets.refusal(address, allowed)
    if why is not None:
        return None, "address_refused", why
    headers = {**signing.headers(keys, msg_id, int(time.time()), body), "host": target.netloc.decode("ascii")}
    # Connect to the address just checked, never to a second lookup of the name; TLS still checks
    # the certificate against the URL's host (sni_hostname).
    pinned = target.copy_with(host=str(address).split("%")[0])
    async with client.stream("POST", pinned, content=body.encode(), headers=headers,
                             extensions={"sni_hostname": target.host}) as response:
        return response.status_code, None, None  # the body is never read: a receiver could send gigabytes


async def apost(url: str, keys: tuple[str, ...], msg_id: str, body: str, *, deadline_s: float,
                allowed: Sequence = ()) -> Answer:  # fmt: skip
    """One signed POST within `deadline_s` all told. Redirects are not followed and no proxy is
    taken from the environment."""
    async with httpx.AsyncClient(verify=_tls(), follow_redirects=False, trust_env=False, timeout=None) as client:
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline_s):
                code, error, why = await _send(client, url, keys, msg_id, body, allowed)
        except TimeoutError:
            return Answer(None, "timeout", _ms(started))
        except (httpx.HTTPError, httpx.InvalidURL, OSError, UnicodeError):  # refused, reset, DNS, TLS, a name no
            # resolver takes: the endpoint did not answer
            return Answer(None, "connection_error", _ms(started))
    if error is not None:
        return Answer(None, error, _ms(started), why)
    return Answer(code, None if 200 <= code < 300 else "http_status", _ms(started))


def post(url: str, keys: tuple[str, ...], msg_id: str, body: str, *, deadline_s: float, allowed: Sequence = ()) -> Answer:
    """`apost` from synchronous code (the API's `test` route runs on a worker thread)."""
    return asyncio.run(apost(url, keys, msg_id, body, deadline_s=deadline_s, allowed=allowed))


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def backoff(settings: Settings, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt number `attempt` (1 is the first)."""
    base = min(settings.webhook_backoff_seconds * 2 ** (attempt - 1), settings.webhook_backoff_max_seconds)
    return base * (1 + settings.webhook_backoff_jitter * (rng or random).random())


@dataclass(frozen=True)
class Claim:
    """A claimed delivery and the time this deliverer's lease on it lapses."""

    due: repo.Due
    lease_until: float


def claim(db: Database, settings: Settings, owner: str, limit: int) -> list[Claim]:
    now = time.time()
    with db.session() as session:
        dues = repo.claim_due(session, now, owner=owner, lease_s=settings.webhook_lease_seconds, limit=limit)
    return [Claim(due, now + settings.webhook_lease_seconds) for due in dues]


async def attempt(db: Database, settings: Settings, box: SecretBox, claim: Claim, owner: str) -> Answer:
    """POST one claimed delivery and record what it got (delivered, retried later, failed, or lost)."""
    due, started_at = claim.due, time.time()
    try:
        keys = box.open_all(due.secrets)
    except SecretUnreadable:
        answer = Answer(None, "secret_unreadable", 0)
    else:
        answer = await apost(due.url, keys, due.event_id, due.payload, deadline_s=settings.webhook_timeout_seconds,
                             allowed=settings.webhook_allowed_networks)
    now = time.time()
    if now > claim.lease_until:  # another deliverer may hold it now: whatever the answer, not delivered
        answer = replace(answer, error="lost")
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

    recorded = await asyncio.to_thread(db.retrying, record, budget_s=settings.db_outage_seconds,
                                       what="record a webhook attempt")
    if not recorded:
        log.warning("webhook delivery %s: the lease lapsed before its attempt was recorded", due.delivery_id)
    return answer


def turn_key(url: str) -> str:
    """What an endpoint's turns are counted by: the URL's origin. Paths, query strings, user info
    and the host's letter case all reach the same receiver, so none of them buys more turns."""
    parts = urlsplit(url)
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower())
    return f"{parts.scheme.lower()}://{(parts.hostname or '').rstrip('.')}:{port}"


class Deliverer:
    """The attempts in flight of one deliverer: at most `webhook_concurrency`, at most
    `webhook_endpoint_concurrency` per endpoint origin (`turn_key`); claims that wait for their endpoint's turn are
    `held` (see the module docstring)."""

    def __init__(self, db: Database, settings: Settings, owner: str):
        self.db, self.settings, self.owner = db, settings, owner
        self.box = SecretBox(settings)
        self.running: set[asyncio.Task] = set()
        self.per_origin: Counter[str] = Counter()
        self.held: dict[str, deque[Claim]] = {}
        self.changed = asyncio.Event()
        per_endpoint = settings.webhook_endpoint_concurrency
        # What one endpoint may have waiting: as many as could still start within a lease.
        self.hold_cap = per_endpoint * max(1, int(settings.webhook_lease_seconds // settings.webhook_timeout_seconds))

    def free(self) -> int:
        return self.settings.webhook_concurrency - len(self.running)

    def place(self, claim: Claim) -> None:
        origin = turn_key(claim.due.url)
        if self.per_origin[origin] < self.settings.webhook_endpoint_concurrency and self.free() > 0:
            self._start(claim)
        elif len(queue := self.held.setdefault(origin, deque())) < self.hold_cap:
            queue.append(claim)
        # else: left to lapse; claimed again once its lease has

    def _start(self, claim: Claim) -> None:
        self.per_origin[turn_key(claim.due.url)] += 1
        task = asyncio.create_task(self._run(claim))
        self.running.add(task)

    async def _run(self, claim: Claim) -> None:
        try:
            await attempt(self.db, self.settings, self.box, claim, self.owner)
        except Exception as exc:  # the database stayed down past its budget: the lease lapses, a later claim retries
            log.error("webhook attempt failed: %s", type(exc).__name__)
        finally:
            self.running.discard(asyncio.current_task())
            self.per_origin[turn_key(claim.due.url)] -= 1
            self._start_held()
            self.changed.set()

    def _start_held(self) -> None:
        """Start what waits for an endpoint that has a free turn, while the pool has room."""
        for origin, queue in list(self.held.items()):
            while queue and self.free() > 0 and self.per_origin[origin] < self.settings.webhook_endpoint_concurrency:
                claim = queue.popleft()
                if claim.lease_until - time.time() > self.settings.webhook_timeout_seconds:
                    self._start(claim)
            if not queue:
                del self.held[origin]

    async def fill(self) -> int:
        """Claim as many as the pool has room for and place them; returns how many were claimed."""
        if self.free() <= 0:
            return 0
        claims = await asyncio.to_thread(claim, self.db, self.settings, self.owner, self.free())
        for one in claims:
            self.place(one)
        return len(claims)

    async def drain(self) -> None:
        while self.running:
            await asyncio.gather(*self.running)

    async def run(self, stop: threading.Event) -> None:
        """Claim whenever the pool has room, until `stop` is set; the attempts in flight are then
        cancelled, unrecorded: their leases lapse and they are sent again (same webhook-id) later."""
        while not stop.is_set():
            try:
                claimed = await self.fill()
            except Exception as exc:  # the database is down: the next pass retries; claims lapse meanwhile
                log.error("webhook claim failed: %s", type(exc).__name__)
                claimed = 0
            if claimed:
                continue  # more may be due
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), self.settings.webhook_poll_seconds)
            except TimeoutError:
                pass
        self.held.clear()
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)


def deliver_due(db: Database, settings: Settings, owner: str) -> list[str]:
    """One round, for tests and tools: claim up to `webhook_concurrency` due deliveries, attempt
    them (each endpoint's in turn) and wait for all; returns the ids claimed."""

    async def round_() -> list[str]:
        deliverer = Deliverer(db, settings, owner)
        claims = await asyncio.to_thread(claim, db, settings, owner, settings.webhook_concurrency)
        for one in claims:
            deliverer.place(one)
        await deliverer.drain()
        return [one.due.delivery_id for one in claims]

    return asyncio.run(round_())


def run_deliverer(db: Database, settings: Settings, owner: str, stop: threading.Event) -> None:
    asyncio.run(Deliverer(db, settings, owner).run(stop))


def start_deliverer(db: Database, settings: Settings, owner: str, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=run_deliverer, args=(db, settings, owner, stop), name="webhook-deliverer",
                              daemon=True)
    thread.start()
    return thread
