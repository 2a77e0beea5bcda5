"""Faults the fuzzers found on PostgreSQL, each pinned by a plain test.

- A NUL character in any path or query parameter answered 500 on nearly every route
  (PostgreSQL cannot compare text holding one); now 400 `invalid_value` naming the parameter.
- Admin amounts and cursors past the database's integer range, and NUL characters in a credit's
  note or idempotency key, answered 500.
- A NUL character in a JSON body (a file id in job create or distill) answered 500; now 400
  `invalid_value` naming the field (serve_app/request_body.py).
"""

from __future__ import annotations

import pytest

import re

import httpx

from openft.settings import Settings
from serve_app.app import create_app
from tests.fuzz.conftest import FUZZ_ADMIN_KEY, serve_in_thread

# make test-fuzz: the faults the fuzzers found, pinned beside the fuzzers' large profile.
pytestmark = pytest.mark.fuzz_large


def _requests_with_a_nul(settings: Settings):
    """(method, url, param) for every /v1 operation the app registers (its own schema lists them)
    and each of its path and query parameters, that parameter holding a NUL."""
    for path, operations in create_app(settings).openapi()["paths"].items():
        if "/admin/" in path:
            continue
        for method, operation in operations.items():
            for param in operation.get("parameters", []):
                name, where = param["name"], param["in"]
                url = re.sub(r"{(\w+)}", lambda m: "a%00b" if m[1] == name else "x", path)
                yield method.upper(), url + (f"?{name}=a%00b" if where == "query" else ""), name


def test_nul_in_any_parameter_is_refused(api, account):
    _, account_id, key = account
    http = httpx.Client(base_url=api.base_url.removesuffix("/v1"), headers={"Authorization": f"Bearer {key}"})
    cases = list(_requests_with_a_nul(api.settings))
    assert len(cases) >= 20
    for method, url, param in cases:
        r = http.request(method, url)
        assert r.status_code == 400, (method, url, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "invalid_value" and r.json()["error"]["param"] == param, (method, url)
    assert http.get("/v1/files").json()["data"] == []


def test_admin_amounts_and_cursors_past_the_columns_are_refused(tmp_path, fresh_pg_url):
    settings = Settings(data_dir=tmp_path, model_source="standin", database_url=fresh_pg_url, admin_key=FUZZ_ADMIN_KEY)
    from tests.conftest import Api

    account_id, _ = Api("admin", settings, "").create_account()
    with serve_in_thread(settings) as (base_url, _state):
        http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {FUZZ_ADMIN_KEY}"})
        admin = f"/gridline/admin/accounts/{account_id}"
        for method, url, body, param in [
            ("POST", "/credits", {"usd": 1.28e224}, "usd"),
            ("POST", "/limits", {"usd_per_day": 1e53}, "usd_per_day"),
            ("POST", "/credits", {"usd": 1, "note": "a\x00b"}, "note"),
            ("POST", "/credits", {"usd": 1, "idempotency_key": "a\x00b"}, "idempotency_key"),
            ("GET", "/ledger?after=-21538538680", None, "after"),
            ("GET", "/ledger?after=2147483648", None, "after"),
        ]:
            r = http.request(method, admin + url, json=body)
            assert r.status_code == 400, (url, r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == "invalid_value" and r.json()["error"]["param"] == param
        assert http.get(admin).json()["balance_usd"] == 0 and http.get(admin + "/ledger").json()["data"] == []


def test_nul_in_a_json_body_is_refused(api, account):
    """A NUL in a JSON body's file id answered 500 on PostgreSQL (job create and distill)."""
    _, account_id, key = account
    http = httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {key}"})
    for url, body, param in [
        ("/fine_tuning/jobs", {"model": "qwen2.5-7b-instruct", "training_file": "file-\x00"}, "training_file"),
        ("/fine_tuning/jobs", {"model": "qwen2.5-7b-instruct", "training_file": "file-a",
                               "metadata": {"k": "v\x00"}}, "metadata.k"),
        ("/files/distill", {"results_file": "file-\x00", "requests_file": "file-b"}, "results_file"),
    ]:
        r = http.post(url, json=body)
        assert r.status_code == 400, (url, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "invalid_value" and r.json()["error"]["param"] == param, (url, r.text)
    assert http.get("/fine_tuning/jobs").json()["data"] == []
    assert http.get("/files").json()["data"] == []
