"""No receiver can slow another account's deliveries (issue 24), with the real deliverer thread
(webhooks/delivery.py) on PostgreSQL: a receiver that trickles its answer a byte at a time holds
its endpoint's turns and no more (however many paths it is registered under), is cut off at the attempt's total deadline, and another account's
delivery still arrives within 2 s; an attempt whose answer comes after its lease lapsed is recorded
`lost`, never `delivered`; `test` has the same total deadline."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from openft.errors import ServiceError
from openft.settings import Settings
from serve_app.services import webhooks as service
from storage.db import Database
from storage.models import WebhookAttempt, WebhookDelivery
from tests.conftest import LOOPBACK_RECEIVERS
from tests.jobs.conftest import postgres  # noqa: F401 (the fixture)
from tests.utils.polling import until
from tests.webhooks.test_delivery import Hooks
from webhooks import outbox
from webhooks.delivery import deliver_due, start_deliverer

DEADLINE_S = 2.0


def _enqueue(hooks: Hooks, account, event_type: str, n: int = 1) -> list[str]:
    with hooks.db.session() as session:
        return [delivery_id for i in range(n)
                for delivery_id in outbox.enqueue(session, account.id, event_type, f"batch_{i:024d}", time.time())]


def _delay(hooks: Hooks, account, receiver, n: int) -> float:
    """Seconds from committing an event of `account` to its receiver's `n`th delivery."""
    queued = time.time()
    _enqueue(hooks, account, "batch.completed")
    got = receiver.wait_for(n, timeout=30)[n - 1]
    assert got.error is None
    return got.at - queued


def _attempts(hooks: Hooks, delivery_ids: list[str]) -> list[WebhookAttempt]:
    with hooks.db.session() as session:
        return list(session.scalars(select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(delivery_ids))))


def test_a_trickling_receiver_delays_no_other_accounts_delivery(postgres, receivers, trickler):  # noqa: F811
    # The defaults but for a shorter deadline (10 s by default; what it bounds is the same).
    hooks = Hooks(*postgres(webhook_timeout_seconds=DEADLINE_S, **LOOPBACK_RECEIVERS))
    a, b = hooks.account(), hooks.account()
    slow, fast = trickler(interval_s=0.5), receivers()
    # The same receiver under a second path and a query string: still one endpoint's two turns.
    hooks.endpoint(a, slow.url, ["batch.completed"])
    hooks.endpoint(a, slow.url.rstrip("/") + "/again?x=1", ["batch.completed"])
    theirs = hooks.endpoint(b, fast.url, ["batch.completed"])
    fast.secret = theirs.signing_secret
    stop = threading.Event()
    thread = start_deliverer(hooks.db, hooks.settings, "ctl-iso.w", stop)
    try:
        baseline = _delay(hooks, b, fast, 1)  # b's delivery with nobody else's in flight
        slow_ids = _enqueue(hooks, a, "batch.completed", 2)  # 4 deliveries (2 URLs): more than the endpoint's 2 turns
        until(lambda: slow.open == 2, "the trickling receiver holding its two turns", timeout=30, interval=0.02)
        delay = _delay(hooks, b, fast, 2)
        print(f"\nwebhook isolation: another account's delivery arrived {delay:.3f} s after its event while a "
              f"trickling receiver held its endpoint's 2 turns ({baseline:.3f} s with no other delivery in flight; "
              f"the deliverer polls every {hooks.settings.webhook_poll_seconds:g} s)")
        assert delay < 2.0, delay
        # Still trickling (nobody waited for it), and the other two wait for its turns: an endpoint
        # never holds more than webhook_endpoint_concurrency of the deliverer's slots.
        assert slow.open == slow.connections == 2

        # The trickler's first attempts end at the total deadline, recorded as timeouts.
        first = until(lambda: (done := _attempts(hooks, slow_ids)) and len(done) >= 2 and done, "the slow attempts",
                      timeout=30, interval=0.1)
        assert {x.error for x in first} == {"timeout"} and all(x.status_code is None for x in first)
        assert all(DEADLINE_S * 1000 <= x.duration_ms < DEADLINE_S * 1000 + 2000 for x in first), first
        until(lambda: slow.connections == 4, "the waiting two taking the turns", timeout=30, interval=0.02)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_an_attempt_that_outlives_its_lease_is_lost_not_delivered(postgres, receivers):  # noqa: F811
    hooks = Hooks(*postgres(webhook_lease_seconds=1, webhook_timeout_seconds=5, webhook_backoff_seconds=60,
                            **LOOPBACK_RECEIVERS))
    a = hooks.account()
    late = receivers(delay_s=1.5)  # answers 200, after the lease lapsed
    hooks.endpoint(a, late.url, ["batch.completed"])
    [delivery_id] = _enqueue(hooks, a, "batch.completed")
    deliver_due(hooks.db, hooks.settings, "ctl-lost.w")
    assert len(late.events()) == 1
    with hooks.db.session() as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        assert (delivery.status, delivery.last_error, delivery.last_status_code) == ("pending", "lost", 200)
        assert delivery.next_attempt_at > time.time() + 30  # retried after the backoff, under the same webhook-id
    [attempt] = _attempts(hooks, [delivery_id])
    assert (attempt.status_code, attempt.error) == (200, "lost")


def test_a_test_event_has_the_same_total_deadline(tmp_path, trickler):
    settings = Settings(data_dir=tmp_path, model_source="standin", webhook_timeout_seconds=1, **LOOPBACK_RECEIVERS)
    hooks = Hooks(settings, Database(settings.resolved_database_url()))
    a = hooks.account()
    slow = trickler(interval_s=0.3)  # a byte well within any per-read timeout
    endpoint = hooks.endpoint(a, slow.url, ["batch.completed"])
    outcome: list = []

    def send() -> None:
        started = time.monotonic()
        try:
            service.send_test_event(hooks.state, a, endpoint.id, {"event_type": "batch.completed"})
        except ServiceError as exc:
            outcome.append((exc.status, exc.code, exc.param, time.monotonic() - started))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the test event was still waiting for the trickling receiver after 15 s"
    [(status, code, param, took)] = outcome
    assert (status, code, param) == (502, "endpoint_unreachable", "webhook_endpoint_id") and took < 3, took
    hooks.db.dispose()


def test_an_endpoints_turns_are_counted_by_its_origin():
    from webhooks.delivery import turn_key

    same = ["https://Hooks.Example.com/a", "https://hooks.example.com:443/b?x=1", "https://u:p@hooks.example.com./c#f"]
    assert {turn_key(url) for url in same} == {"https://hooks.example.com:443"}
    assert len({turn_key(url) for url in ("http://hooks.example.com/a", "https://hooks.example.com/a",
                                          "https://hooks.example.com:8443/a", "https://other.example.com/a")}) == 4
