"""API keys (issue 24) through the deployed API, SQLite and PostgreSQL: an account creates, lists,
uses and revokes its own keys (another account's answer 404), a revoked or expired key answers 401
at once, every refusal answers its status, code and param and creates nothing; the operator does
the same for any account through the admin API and `openft accounts keys`. Revocation under load
on PostgreSQL with two API replicas: tests/serve_app/test_key_revocation_load.py (make test-heavy)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from serve_app.schemas.api_keys import MAX_EXPIRES_IN_S
from storage.api_keys import lookup
from storage.db import Database
from tests.conftest import ADMIN_KEY

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _http(api, key: str) -> httpx.Client:
    return httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _keys(http: httpx.Client) -> list[dict]:
    r = http.get("/gridline/api_keys")
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_an_account_creates_lists_uses_and_revokes_its_own_keys(api):
    _, key = api.create_account()
    _, other_key = api.create_account()
    http, other = _http(api, key), _http(api, other_key)
    [default] = _keys(http)
    assert (default["object"], default["name"], default["expires_at"]) == ("gridline.api_key", "default", None)
    assert default["redacted_value"] == "sk-openft-..." + key[-4:] and default["last_used_at"] >= default["created_at"]

    made = http.post("/gridline/api_keys", json={"name": "ci", "expires_in_seconds": 3600}).json()
    new_key = made.pop("value")
    assert new_key.startswith("sk-openft-") and len(new_key) > 40 and made["expires_at"] == made["created_at"] + 3600
    listed = _keys(http)
    assert [k["id"] for k in listed] == [made["id"], default["id"]] and new_key not in str(listed)
    assert all(set(k) == set(made) for k in listed)  # never the value again
    assert http.get(f"/gridline/api_keys/{made['id']}").json() == {**made, "last_used_at": None}

    client = api.client(new_key)  # the new key works with the official SDK, for the same account
    assert client.files.list().data == [] and _keys(_http(api, new_key))[0]["id"] == made["id"]
    assert http.get(f"/gridline/api_keys/{made['id']}").json()["last_used_at"] is not None

    for method in ("GET", "DELETE"):  # another account's key is not there for it
        r = other.request(method, f"/gridline/api_keys/{made['id']}")
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (404, "not_found", "key_id")
    assert client.files.list().data == []

    gone = http.delete(f"/gridline/api_keys/{made['id']}").json()
    assert gone == {"object": "gridline.api_key.deleted", "id": made["id"], "deleted": True}
    with pytest.raises(openai.AuthenticationError) as refused:  # at once: no cache outlives it
        client.files.list()
    assert refused.value.code == "invalid_api_key"
    assert [k["id"] for k in _keys(http)] == [default["id"]]
    r = http.delete(f"/gridline/api_keys/{made['id']}")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")

    # An account may revoke the key it calls with: that call succeeds, the next is refused.
    assert http.delete(f"/gridline/api_keys/{default['id']}").status_code == 200
    assert http.get("/gridline/api_keys").status_code == 401


def test_an_expired_key_answers_401(api):
    _, key = api.create_account()
    # Times are whole seconds (the key expires at its creation second plus 4), so the key works for
    # 3 to 4 s: room for the first request on a loaded machine (a 1 s key once expired before it, in CI).
    short = _http(api, key).post("/gridline/api_keys", json={"name": "short", "expires_in_seconds": 4}).json()
    client = api.client(short["value"])
    client.files.list()
    time.sleep(max(0.0, short["expires_at"] - time.time()) + 0.2)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.files.list()
    assert refused.value.code == "invalid_api_key" and "expired" in refused.value.message


BAD_CREATES = [
    ({}, "name"), ({"name": ""}, "name"), ({"name": "x" * 257}, "name"), ({"name": 5}, "name"),
    ({"name": "a\u0000b"}, "name"), ({"name": "ci", "expires_in_seconds": 0}, "expires_in_seconds"),
    ({"name": "ci", "expires_in_seconds": True}, "expires_in_seconds"),
    ({"name": "ci", "expires_in_seconds": 60.0}, "expires_in_seconds"),
    ({"name": "ci", "expires_in_seconds": MAX_EXPIRES_IN_S + 1}, "expires_in_seconds"),
    ({"name": "ci", "expires_in_seconds": "1" * 5000}, "expires_in_seconds"),
]


def test_a_bad_create_is_refused_and_makes_nothing(api):
    _, key = api.create_account()
    http = _http(api, key)
    for body, param in BAD_CREATES:
        r = http.post("/gridline/api_keys", json=body)
        assert r.status_code == 400, (body, r.text)
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_value", param), body
    assert len(_keys(http)) == 1


def test_an_unknown_field_and_the_key_limit_are_refused(apis):
    api = apis("sqlite")
    _, key = api.create_account()
    http = _http(api, key)
    r = http.post("/gridline/api_keys", json={"name": "ci", "scopes": ["all"]})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (400, "unknown_parameter", "scopes")
    limit = api.settings.api_keys_per_account
    for i in range(limit - 1):
        assert http.post("/gridline/api_keys", json={"name": f"k{i}"}).status_code == 200
    r = http.post("/gridline/api_keys", json={"name": "one too many"})
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (429, "limit_exceeded", None)
    assert r.json()["error"]["limit"] == {"limit": limit, "current": limit} and r.headers["x-should-retry"] == "false"
    listed = http.get("/gridline/api_keys", params={"limit": 100}).json()["data"]
    assert len(listed) == limit


def _admin(api, method: str, path: str, **body) -> httpx.Response:
    return httpx.request(method, f"{api.base_url}/gridline/admin/accounts/{path}", json=body or None,
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)


def test_the_operator_lists_creates_and_revokes_an_accounts_keys(admin_api):
    account_id, key = admin_api.create_account()
    [default] = _admin(admin_api, "GET", f"{account_id}/api_keys").json()["data"]
    made = _admin(admin_api, "POST", f"{account_id}/api_keys", name="support").json()
    client = admin_api.client(made["value"])
    assert client.files.list().data == []
    r = _http(admin_api, key).get("/gridline/admin/accounts/" + account_id + "/api_keys")  # an account key: not here
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    assert _admin(admin_api, "DELETE", f"{account_id}/api_keys/{made['id']}").json()["deleted"] is True
    with pytest.raises(openai.AuthenticationError):
        client.files.list()
    assert [k["id"] for k in _admin(admin_api, "GET", f"{account_id}/api_keys").json()["data"]] == [default["id"]]
    r = _admin(admin_api, "DELETE", f"acct-nobody/api_keys/{default['id']}")
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (404, "not_found", "account")


def test_the_operator_cli_manages_keys(tmp_path, capsys):
    from entrypoints.cli import main

    def openft(*args: str) -> tuple[int, str, str]:
        status = main([*args, "--data-dir", str(tmp_path)])
        out, err = capsys.readouterr()
        return status, out, err

    first = openft("accounts", "create", "alice")[1].strip().splitlines()[-1]
    status, out, err = openft("accounts", "keys", "create", "alice", "--name", "ci", "--expires-in-seconds", "600")
    assert status == 0, err
    new_key = out.strip().splitlines()[-1]
    assert new_key.startswith("sk-openft-") and new_key != first and out.count(new_key) == 1
    status, listed, _ = openft("accounts", "keys", "list", "alice")
    assert status == 0 and '"name": "ci"' in listed and new_key not in listed
    key_id = next(line.split('"')[3] for line in listed.splitlines() if '"id": "key_' in line)  # the newest first
    status, _, err = openft("accounts", "keys", "create", "alice", "--name", "x", "--expires-in-seconds", "0")
    assert status == 2 and "--expires-in-seconds" in err
    assert openft("accounts", "keys", "revoke", "alice", key_id)[0] == 0
    assert openft("accounts", "keys", "revoke", "nobody", key_id)[0] == 2
    db = Database(f"sqlite:///{tmp_path / 'openft.db'}")
    try:
        with db.session() as session:
            (revoked, _), (kept, _) = lookup(session, new_key), lookup(session, first)
            assert revoked.id == key_id and revoked.revoked_at is not None and kept.revoked_at is None
    finally:
        db.dispose()
