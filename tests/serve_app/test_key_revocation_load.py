"""Revocation under load (issue 24), on PostgreSQL behind two API replicas: clients call with a key
through the Serve proxy, whose router spreads them over both replicas, while the account revokes
it with another key. Every request sent after the revoke answered is refused 401 (no replica keeps
it alive from a cache), every one answered before the revoke was sent succeeded, another
account's key is untouched, and nothing answers 5xx. Its own deployment: make test-heavy."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest

pytestmark = [pytest.mark.heavy, pytest.mark.usefixtures("ray_cluster")]
CLIENTS = 8


def test_a_revoked_key_is_refused_at_once_by_both_replicas_under_load(apis, pg_database_url):
    from ray import serve

    api = apis("postgres-2", database_url=pg_database_url, api_replicas=2)
    deployment = serve.status().applications[api.name].deployments["openft-api"]
    assert deployment.replica_states == {"RUNNING": 2}
    _, key = api.create_account()
    _, bystander = api.create_account()
    admin = httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    victim = admin.post("/gridline/api_keys", json={"name": "leaked"}).json()
    results: list[tuple[str, float, float, int]] = []  # (whose, sent, answered, status)
    lock, stop = threading.Lock(), threading.Event()

    def hammer(whose: str, k: str) -> None:
        with httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {k}"}, timeout=60) as http:
            while not stop.is_set():
                sent = time.monotonic()
                status = http.get("/files", params={"limit": 1}).status_code
                with lock:
                    results.append((whose, sent, time.monotonic(), status))

    threads = [threading.Thread(target=hammer, args=("victim", victim["value"])) for _ in range(CLIENTS)]
    threads.append(threading.Thread(target=hammer, args=("bystander", bystander)))
    for t in threads:
        t.start()
    time.sleep(3)
    revoke_sent = time.monotonic()
    assert admin.delete(f"/gridline/api_keys/{victim['id']}").status_code == 200
    revoke_answered = time.monotonic()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(timeout=60)

    before = Counter(s for who, _, answered, s in results if who == "victim" and answered < revoke_sent)
    after = Counter(s for who, sent, _, s in results if who == "victim" and sent > revoke_answered)
    racing = Counter(s for who, sent, answered, s in results
                     if who == "victim" and answered >= revoke_sent and sent <= revoke_answered)
    others = Counter(s for who, _, _, s in results if who == "bystander")
    print(f"\nrevocation under load, 2 replicas, PostgreSQL: before {dict(before)}, during the revoke "
          f"{dict(racing)}, after {dict(after)}, another account {dict(others)}; revoke took "
          f"{(revoke_answered - revoke_sent) * 1000:.0f} ms")
    assert set(before) == {200} and before[200] > 20
    assert set(after) == {401} and after[401] > 20
    assert set(racing) <= {200, 401} and set(others) == {200}
