"""Rate limits per account and uploads in flight per account (serve_app/rate_limits.py).

Against the running API with limits on (the suite's deployments run without): on PostgreSQL the
Serve app beside a second replica that shares its database, the same app from the same settings
under bare uvicorn (which also runs the app without Ray, as `create_app` promises); on SQLite
that bare app alone.
The database-level tests race real threads on the real upsert and lock.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import openai
import orjson
import pytest
import uvicorn
from sqlalchemy import func, select

from openft.demo_data import ticket_splits, tickets_jsonl
from openft.settings import Settings
from serve_app.app import create_app
from serve_app.rate_limits import acquire_slot
from serve_app.state import AppState
from storage import rate_limits as repo
from storage.db import Database
from storage.models import UploadSlot
from tests.conftest import Api, _new_pg_database, free_port
from tests.factories import db_account
from tests.utils.polling import until

# make test-heavy: a deployment of its own with the limits on, and waits on real token buckets.
pytestmark = pytest.mark.heavy

GOOD = tickets_jsonl(ticket_splits()[0][:30])
RATE, BURST = 1.0, 12  # the general bucket
HEAVY_BURST = 6  # at one per 20 s, so that no token comes back within a test
LEASE_S = 2.0
LIMITS = dict(rate_limit_requests_per_second=RATE, rate_limit_requests_burst=BURST,
              rate_limit_heavy_per_second=0.05, rate_limit_heavy_burst=HEAVY_BURST,
              uploads_in_flight_per_account=2, upload_slot_lease_seconds=LEASE_S)


@pytest.fixture(scope="module")
def shared_pg_url():
    with _new_pg_database("openft_rl") as url:
        yield url


@contextlib.contextmanager
def _bare_app(settings):
    """The same app from the same settings under plain uvicorn in a thread (no Ray): a second replica."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        until(lambda: server.started, "the bare app up", timeout=60)
        yield Api(name="bare", settings=settings, base_url=f"http://127.0.0.1:{port}/v1")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def pg_pair(apis, shared_pg_url):
    """Two replicas on one PostgreSQL database: the Serve app, and the same app under bare uvicorn."""
    served = apis("rl-postgres", database_url=shared_pg_url, **LIMITS)
    with _bare_app(served.settings) as bare:
        yield served, bare


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def limited(request, session_dir):
    if request.param == "postgres":
        yield request.getfixturevalue("pg_pair")[0]
        return
    # Bare uvicorn: a Serve deployment more would cost the suite more than these calls do.
    with _bare_app(Settings(data_dir=session_dir / "api-rl-sqlite", model_source="standin", **LIMITS)) as app:
        yield app


def _upload(client, data: bytes = GOOD):
    return client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")


def _refused(call) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as info:
        call()
    return _checked(info.value)


def _checked(exc: openai.RateLimitError) -> openai.RateLimitError:
    assert exc.status_code == 429 and exc.code == "rate_limit_exceeded" and exc.type == "rate_limit_error"
    assert exc.param is None
    assert "x-should-retry" not in exc.response.headers  # a rate: retrying after Retry-After gets through
    return exc


def _retry_after(exc: openai.APIStatusError) -> int:
    return int(exc.response.headers["retry-after"])  # an integer number of seconds


def _until_refused(call, most: int) -> tuple[int, float, openai.RateLimitError]:
    """Call until refused: (calls let through, seconds taken, the refusal)."""
    started, passed = time.monotonic(), 0
    for _ in range(most):
        try:
            call()
        except openai.RateLimitError as exc:
            return passed, time.monotonic() - started, exc
        passed += 1
    raise AssertionError(f"no 429 in {most} calls")


def test_over_the_rate_a_key_gets_429_with_retry_after_and_then_passes(limited):
    _, key = limited.create_account()
    _, other_key = limited.create_account()
    client = limited.client(key)
    passed, took, refusal = _until_refused(client.models.list, most=4 * BURST)
    assert BURST <= passed <= BURST + RATE * took + 1
    _checked(refusal)
    assert 1 <= _retry_after(refusal) <= 1 / RATE
    assert "limit" not in refusal.body  # a bucket has no quota to show; the message names the rate

    limited.client(other_key).models.list()  # another account's bucket is its own
    time.sleep(_retry_after(refusal))
    client.models.list()
    # A retrying client (the SDK's default) waits out Retry-After and gets through.
    _until_refused(client.models.list, most=4 * BURST)
    openai.OpenAI(base_url=limited.base_url, api_key=key, max_retries=1).models.list()


def test_uploads_and_creates_share_the_stricter_bucket_and_reads_do_not(limited):
    account_id, key = limited.create_account()
    client = limited.client(key)
    uploaded = []
    for i in range(HEAVY_BURST):
        if i % 2:
            with pytest.raises(openai.BadRequestError):  # counted whatever it answers
                client.fine_tuning.jobs.create(model="", training_file="")
        else:
            uploaded.append(_upload(client).id)
    for call in (lambda: _upload(client), lambda: client.fine_tuning.jobs.create(model="m", training_file=uploaded[0])):
        refusal = _refused(call)
        assert _retry_after(refusal) >= 1
    # Reads take from the general bucket only; the refusals created nothing.
    assert sorted(f.id for f in client.files.list().data) == sorted(uploaded)
    assert client.fine_tuning.jobs.list().data == []
    state = AppState.from_settings(limited.settings)
    assert len(list(state.store.list(f"files/{account_id}/"))) == len(uploaded)


def test_two_replicas_together_allow_the_rate_once(pg_pair):
    a, b = pg_pair
    _, key = a.create_account()
    clients = [a.client(key), b.client(key)]
    calls = iter(range(10**6))
    passed, took, _ = _until_refused(lambda: clients[next(calls) % 2].models.list(), most=4 * BURST)
    # Each replica with a bucket of its own would let about twice the burst through.
    assert passed <= BURST + RATE * took + 1
    _refused(clients[0].models.list)
    _refused(clients[1].models.list)


# -- uploads in flight -----------------------------------------------------------------------------
BOUNDARY = "rl-" + uuid.uuid4().hex


def _multipart(data: bytes) -> tuple[bytes, bytes]:
    """A multipart upload body of `data`, split in two halves mid-file."""
    head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="train.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n").encode()
    half = data.index(b"\n", len(data) // 2) + 1
    return head + data[:half], data[half:] + f"\r\n--{BOUNDARY}--\r\n".encode()


class SlowUpload:
    """An upload that sends half its body now and the rest (or nothing, hanging up) when told."""

    def __init__(self, api, key: str):
        url = urlsplit(api.base_url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        head, self.rest = _multipart(GOOD)
        self.conn.putrequest("POST", url.path + "/files")
        self.conn.putheader("Authorization", f"Bearer {key}")
        self.conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
        self.conn.putheader("Content-Length", str(len(head) + len(self.rest)))
        self.conn.endheaders()
        self.conn.send(head)

    def finish(self) -> tuple[int, dict]:
        self.conn.send(self.rest)
        response = self.conn.getresponse()
        return response.status, orjson.loads(response.read())

    def hang_up(self) -> None:
        self.conn.close()


def _slots_held(db: Database, account_id: str) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(UploadSlot).where(UploadSlot.account_id == account_id))


def test_uploads_in_flight_are_capped_per_account_across_replicas_and_freed_however_they_end(pg_pair):
    a, b = pg_pair
    account_id, key = a.create_account()
    _, other_key = a.create_account()
    db = Database(a.settings.resolved_database_url(), migrate=False)
    try:
        first, second = SlowUpload(b, key), SlowUpload(a, key)
        until(lambda: _slots_held(db, account_id) == 2, "two uploads in flight")
        time.sleep(1.5 * LEASE_S)  # past a lease: their replicas renew them

        refusal = _refused(lambda: _upload(a.client(key)))
        assert refusal.body["limit"] == {"limit": 2, "current": 2} and _retry_after(refusal) == 1
        _upload(b.client(other_key))  # another account's slots are its own

        status, stored = first.finish()
        assert status == 200 and stored["status"] == "processed"
        with pytest.raises(openai.BadRequestError):
            _upload(b.client(key), b"not json\n")
        assert _slots_held(db, account_id) == 1  # refused: its slot is free again; the slow one holds its own
        third = SlowUpload(b, key)
        until(lambda: _slots_held(db, account_id) == 2, "a third upload in flight")
        second.hang_up()  # Serve cancels the request
        third.hang_up()  # uvicorn tells the app that the client is gone
        until(lambda: _slots_held(db, account_id) == 0, "the slots freed", timeout=30)
        last = _upload(b.client(key))
        # Only the uploads that ended whole were stored: not the refused one, nor the one hung up.
        assert sorted(f.id for f in a.client(key).files.list().data) == sorted([stored["id"], last.id])
    finally:
        db.dispose()


# -- the database itself, raced by threads -----------------------------------------------------------
@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request, tmp_path_factory):
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path_factory.mktemp('rl') / 'openft.db'}")
        yield database
    else:
        database = Database(request.getfixturevalue("shared_pg_url"))
        yield database
    database.dispose()


def _race(n: int, work) -> list:
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_concurrent_takes_let_exactly_the_burst_through(db):
    first, second = db_account(db), db_account(db)

    def take(i):
        with db.session() as session:
            return repo.take_token(session, first if i % 2 else second, "requests", rate=1e-6, burst=5)

    waits = _race(16, take)
    assert sum(w == 0 for w in waits) == 10  # five for each account, however the threads interleave
    assert all(w > 1000 for w in waits if w)


def test_concurrent_uploads_get_exactly_the_cap_and_a_lapsed_lease_holds_none(db):
    account_id = db_account(db)
    held = _race(8, lambda i: acquire_slot(db, account_id, f"h{i}", cap=3, lease_s=60) < 3)
    assert sum(held) == 3
    with db.session() as session:
        # Their replica died: its leases lapse.
        session.execute(UploadSlot.__table__.update().where(UploadSlot.account_id == account_id)
                        .values(expires_at=time.time() - 1))
    assert acquire_slot(db, account_id, "new", cap=3, lease_s=60) == 0
