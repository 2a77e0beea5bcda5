"""Webhook delivery on a database of each test's own (SQLite and PostgreSQL), to real receivers
on 127.0.0.1 that check every POST with the official SDK: the outbox row commits with the job's
or batch's end (and not without it), retries back off and keep the webhook-id, failures of each
kind end `failed` after the retry window, only the account's own endpoints get its events, two
deliverers racing never send one delivery twice within a lease, and the reaper ends the log."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from batches import run as batch_run
from batches import transitions as batch_transitions
from jobs import transitions
from openft.errors import NotFound
from serve_app.services import webhooks as service
from serve_app.services.retention import reap_once
from storage import webhooks as repo
from storage.db import Database
from storage.models import Job, WebhookAttempt, WebhookDelivery
from tests.batches.test_lifecycle import World
from tests.conftest import LOOPBACK_RECEIVERS, free_port
from tests.factories import db_create_job, db_training_file
from tests.jobs.conftest import backend  # noqa: F401 (the fixture)
from tests.utils.polling import until
from webhooks import events, outbox
from webhooks.delivery import backoff, deliver_due

FAST = dict(webhook_backoff_seconds=0.3, webhook_backoff_jitter=0.5, webhook_timeout_seconds=2,
            webhook_lease_seconds=5, batch_completion_window_seconds=60, **LOOPBACK_RECEIVERS)


class Hooks(World):
    def endpoint(self, account, url: str, event_types=events.EVENT_TYPES):
        return service.create_endpoint(self.state, account, {"name": "test", "url": url,
                                                             "event_types": list(event_types)})

    def deliveries(self, endpoint_id: str) -> list[WebhookDelivery]:
        with self.db.session() as session:
            return list(session.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)))

    def deliver_until_settled(self, endpoint_id: str, owner: str = "ctl-test.w", timeout: float = 30) -> None:
        def settled():
            deliver_due(self.db, self.settings, owner)
            return all(d.status != "pending" for d in self.deliveries(endpoint_id))
        until(settled, "settled deliveries", timeout, 0.05)

    def job(self, account) -> str:
        return db_create_job(self.db, account.id, db_training_file(self.db, account.id))


@pytest.fixture
def hooks(backend):  # noqa: F811
    return Hooks(*backend(**FAST))


def test_a_cancelled_job_is_delivered_signed_retried_with_backoff_and_to_its_account_only(hooks, receivers):
    a, b = hooks.account(), hooks.account()
    mine, theirs = receivers(answers=[500, 500]), receivers()
    endpoint = hooks.endpoint(a, mine.url, ["fine_tuning.job.cancelled"])
    other = hooks.endpoint(b, theirs.url)
    mine.secret, theirs.secret = endpoint.signing_secret, other.signing_secret
    job_id = hooks.job(a)
    with hooks.db.session() as session:
        assert transitions.cancel(session, transitions.lock_job(session, job_id), int(time.time())).ok
    [queued] = hooks.deliveries(endpoint.id)  # committed with the cancel, before any deliverer ran
    assert (queued.status, queued.attempts, queued.event_type) == ("pending", 0, "fine_tuning.job.cancelled")
    assert hooks.deliveries(other.id) == []

    hooks.deliver_until_settled(endpoint.id)
    got = mine.events()
    assert len(got) == 3 and all(r.error is None for r in got)
    assert {r.headers["webhook-id"] for r in got} == {queued.event_id}  # the same id on every retry
    for r in got:
        event = r.event
        assert (type(event).__name__, event.type, event.data.id, event.id) == (
            "FineTuningJobCancelledWebhookEvent", "fine_tuning.job.cancelled", job_id, queued.event_id)
        assert event.object == "event" and set(event.model_dump()) == {"id", "object", "created_at", "type", "data"}
    assert got[1].at - got[0].at >= 0.3 and got[2].at - got[1].at >= 0.6  # 0.3 s, then doubled (jitter only adds)

    [log] = service.list_deliveries(hooks.state, a, endpoint.id, limit=10, after=None).data
    assert (log.status, log.attempts, log.event_id, log.data_id) == ("delivered", 3, queued.event_id, job_id)
    assert [(x.attempt, x.status_code, x.error) for x in log.attempt_log] == [
        (1, 500, "http_status"), (2, 500, "http_status"), (3, 200, None)]
    first, second, last = log.attempt_log
    assert first.next_attempt_at - first.started_at >= 0.3 and second.next_attempt_at > first.next_attempt_at
    assert last.next_attempt_at is None and log.next_attempt_at is None and log.finished_at >= last.started_at
    assert theirs.events() == []  # b's endpoint never hears of a's job
    with pytest.raises(NotFound):  # nor may b read a's log
        service.list_deliveries(hooks.state, b, endpoint.id, limit=10, after=None)


def test_an_end_that_rolls_back_queues_nothing_and_a_batch_end_is_delivered(hooks, receivers):
    a = hooks.account()
    receiver = receivers()
    endpoint = hooks.endpoint(a, receiver.url, ["batch.cancelled", "fine_tuning.job.failed"])
    receiver.secret = endpoint.signing_secret
    job_id = hooks.job(a)
    with pytest.raises(RuntimeError):
        with hooks.db.session() as session:
            transitions.finish(session, transitions.lock_job(session, job_id), "failed", int(time.time()),
                               error=transitions.job_error("training_failed", "x"))
            raise RuntimeError("the process dies before the commit")
    assert hooks.deliveries(endpoint.id) == []
    with hooks.db.session() as session:
        assert session.get(Job, job_id).status == "queued"

    batch_id = hooks.batch(a)
    with hooks.db.session() as session:  # cancelled before it ran: the controller's close ends it
        batch_transitions.cancel(session, batch_transitions.lock_batch(session, batch_id), int(time.time()))
    [claim] = hooks.claim(now=int(time.time()), fit=0)
    batch_run.drive(hooks.ctx, claim)
    assert hooks.get(batch_id).status == "cancelled"
    hooks.deliver_until_settled(endpoint.id)
    [got] = receiver.events()
    assert (type(got.event).__name__, got.event.data.id) == ("BatchCancelledWebhookEvent", batch_id)


def test_timeouts_refused_connections_and_errors_fail_after_the_retry_window(backend, receivers):  # noqa: F811
    hooks = Hooks(*backend(**{**FAST, "webhook_timeout_seconds": 0.3, "webhook_retry_window_seconds": 3}))
    a = hooks.account()
    slow, failing = receivers(delay_s=1.0), receivers(answers=[503] * 100)
    closed = f"http://127.0.0.1:{free_port()}/hooks"  # nothing listens there
    endpoints = {kind: hooks.endpoint(a, url, ["fine_tuning.job.cancelled"]).id
                 for kind, url in (("timeout", slow.url), ("connection_error", closed), ("http_status", failing.url))}
    job_id = hooks.job(a)
    with hooks.db.session() as session:
        transitions.cancel(session, transitions.lock_job(session, job_id), int(time.time()))
    for kind, endpoint_id in endpoints.items():
        hooks.deliver_until_settled(endpoint_id)
        [delivery] = hooks.deliveries(endpoint_id)
        assert (delivery.status, delivery.last_error, delivery.next_attempt_at) == ("failed", kind, None)
        [log] = service.list_deliveries(hooks.state, a, endpoint_id, limit=10, after=None).data
        assert len(log.attempt_log) >= 2 and {x.error for x in log.attempt_log} == {kind}
        assert log.attempt_log[-1].next_attempt_at is None  # the last: its next would fall past the window
        assert all(x.next_attempt_at <= delivery.created_at + 3 for x in log.attempt_log[:-1])
    assert [r.status_code for r in service.list_deliveries(hooks.state, a, endpoints["http_status"], limit=1,
                                                             after=None).data[0].attempt_log] == [
        503] * len(failing.events())


def test_backoff_doubles_up_to_its_cap_and_jitter_only_adds(hooks):
    settings = hooks.settings.model_copy(update={"webhook_backoff_seconds": 30, "webhook_backoff_max_seconds": 3600,
                                                 "webhook_backoff_jitter": 0.2})
    waits = [backoff(settings, n) for n in range(1, 10)]
    for n, wait in enumerate(waits, start=1):
        base = min(30 * 2 ** (n - 1), 3600)
        assert base <= wait <= base * 1.2


def test_a_lease_decides_who_delivers_and_a_lapsed_one_records_nothing(hooks, receivers):
    a = hooks.account()
    receiver = receivers()
    hooks.endpoint(a, receiver.url, ["fine_tuning.job.succeeded"])
    now = time.time()
    with hooks.db.session() as session:
        [delivery_id] = outbox.enqueue(session, a.id, "fine_tuning.job.succeeded", "ftjob-" + "1" * 32, now)
    with hooks.db.session() as session:
        [first] = repo.claim_due(session, now, owner="x", lease_s=5, limit=10)
    with hooks.db.session() as session:
        assert repo.claim_due(session, now + 4, owner="y", lease_s=5, limit=10) == []  # within x's lease
    with hooks.db.session() as session:
        [second] = repo.claim_due(session, now + 6, owner="y", lease_s=5, limit=10)  # x's lease lapsed
    assert (first.attempt, second.attempt, second.event_id) == (1, 2, first.event_id)
    fields = dict(started_at=now, duration_ms=1, status_code=200, error=None, status="delivered", next_attempt_at=None,
                  now=now + 7)
    with hooks.db.session() as session:
        assert not repo.record_attempt(session, first, "x", **fields)  # x's late answer changes nothing
        assert repo.record_attempt(session, second, "y", **fields)
    with hooks.db.session() as session:
        assert session.get(WebhookDelivery, delivery_id).status == "delivered"
        assert session.scalar(select(func.count()).select_from(WebhookAttempt)) == 1
        assert repo.claim_due(session, now + 100, owner="z", lease_s=5, limit=10) == []
    day = 86400  # the reaper keeps the log 30 days after the end
    assert reap_once(hooks.state, int(now) + 29 * day)["webhook_deliveries"] == 0
    assert reap_once(hooks.state, int(now) + 31 * day)["webhook_deliveries"] == 1
    with hooks.db.session() as session:
        assert session.get(WebhookDelivery, delivery_id) is None
        assert session.scalar(select(func.count()).select_from(WebhookAttempt)) == 0


def test_two_deliverers_racing_deliver_each_event_once(hooks, receivers):
    a = hooks.account()
    receiver = receivers(delay_s=0.05)
    endpoint = hooks.endpoint(a, receiver.url, ["batch.completed"])
    receiver.secret = endpoint.signing_secret
    n, now = 16, time.time()
    with hooks.db.session() as session:
        for i in range(n):
            outbox.enqueue(session, a.id, "batch.completed", f"batch_{i:024d}", now)
    settings = hooks.settings.model_copy(update={"webhook_concurrency": 3})
    errors = []

    def deliverer(owner: str) -> None:
        db = Database(settings.resolved_database_url(), migrate=False)  # a process of its own would have its own pool
        try:
            while any(d.status == "pending" for d in hooks.deliveries(endpoint.id)):
                deliver_due(db, settings, owner)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            db.dispose()

    threads = [threading.Thread(target=deliverer, args=(f"ctl-{i}.w",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    got = receiver.events()
    ids = [r.headers["webhook-id"] for r in got]
    assert len(ids) == n and len(set(ids)) == n and all(r.error is None for r in got)
    assert sorted(r.event.data.id for r in got) == [f"batch_{i:024d}" for i in range(n)]
    deliveries = hooks.deliveries(endpoint.id)
    assert {(d.status, d.attempts, d.lease_owner) for d in deliveries} == {("delivered", 1, None)}
    with hooks.db.session() as session:
        assert session.scalar(select(func.count()).select_from(WebhookAttempt)) == n
    pages, after = [], None  # the owner's log, five at a time
    while True:
        page = service.list_deliveries(hooks.state, a, endpoint.id, limit=5, after=after)
        pages.append([d.id for d in page.data])
        if not page.has_more:
            break
        after = page.last_id
    assert [len(p) for p in pages] == [5, 5, 5, 1] and {i for p in pages for i in p} == {d.id for d in deliveries}
