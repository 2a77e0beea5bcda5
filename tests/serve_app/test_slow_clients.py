"""Slow clients through the deployed API (raw sockets against Serve's proxy): bodies that trickle
or stall are cut off with 408 request_timeout and their connection closed, and while they last
the other clients are served; issue 12's five 1-byte-per-second uploads took the API down."""

from __future__ import annotations

import io
import os
import time
import uuid

import httpx
import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from serve_app.state import AppState
from tests.conftest import _deploy, _new_pg_database
from tests.utils.slow_upload import SlowUpload

# make test-heavy: a deployment of its own, and clients that trickle for the timeouts to run out.
pytestmark = pytest.mark.heavy

# Small limits so the cut-offs come within seconds: a stalled body is cut after IDLE_S, a
# trickling one (1 byte/s, never idle that long) once it has waited GRACE_S below MIN_RATE.
IDLE_S, GRACE_S, MIN_RATE = 3.0, 6.0, 100


@pytest.fixture(scope="module")
def slow_api(serve_port, session_dir):
    """A deployment of its own on a fresh PostgreSQL database, with the small limits above."""
    from ray import serve

    from openft.settings import Settings

    with _new_pg_database("openft_slow") as url:
        name = f"slow-{uuid.uuid4().hex[:6]}"
        settings = Settings(
            data_dir=session_dir / f"api-{name}", database_url=url, model_source="standin",
            body_idle_timeout_seconds=IDLE_S, body_rate_grace_seconds=GRACE_S, upload_min_bytes_per_second=MIN_RATE,
        )
        api = _deploy(name, settings, serve_port)
        yield api
        serve.delete(name)


def _stored(api, account_id: str) -> list[str]:
    """The account's objects, and any half-written upload left in the local store's temp dir."""
    store = AppState.from_settings(api.settings).store
    return [*store.list(f"files/{account_id}/"), *os.listdir(store.root / ".tmp")]


def test_trickling_uploads_do_not_starve_reads_and_are_cut_off(slow_api):
    uploaders = [slow_api.create_account() for _ in range(5)]
    reader_id, reader_key = slow_api.create_account()
    slow = [SlowUpload(slow_api.base_url, key).start() for _, key in uploaders]
    time.sleep(1.5)  # the five are in the replica, holding their slots

    served = []
    with httpx.Client(base_url=slow_api.base_url, headers={"Authorization": f"Bearer {reader_key}"}, timeout=30) as c:
        for _ in range(5):
            response = c.get("/files")
            served.append((response.status_code, time.monotonic()))
    for s in slow:
        s.thread.join(60)

    assert [status for status, _ in served] == [200] * 5
    first_cut = min(s.answered_at for s in slow)
    # The reads were answered while all five uploads still held their connections.
    assert all(at < first_cut for _, at in served), "reads waited for the slow uploads to be cut off"
    for s, (account_id, _) in zip(slow, uploaders):
        status, error = s.status_and_error()
        assert (status, error["code"], error["param"]) == (408, "request_timeout", None)
        assert "slower than 100 bytes per second" in error["message"]
        assert s.closed_at is not None, "the server kept the slow connection open"
        assert _stored(slow_api, account_id) == []
        client = slow_api.client(uploaders[slow.index(s)][1])
        assert client.files.list().data == []


def test_stalled_body_is_cut_off_after_the_idle_timeout(slow_api):
    account_id, key = slow_api.create_account()
    stalled = SlowUpload(slow_api.base_url, key, trickle=False).start()
    stalled.thread.join(60)

    status, error = stalled.status_and_error()
    assert (status, error["code"], error["param"]) == (408, "request_timeout", None)
    assert "sent nothing for 3 s" in error["message"]
    assert stalled.closed_at is not None
    assert _stored(slow_api, account_id) == []
    # A body sent at speed is untouched by the guard.
    client = slow_api.client(key)
    data = tickets_jsonl(ticket_splits()[0][:20])
    uploaded = client.files.create(file=("t.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert [f.id for f in client.files.list().data] == [uploaded.id]
