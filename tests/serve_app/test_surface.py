"""The API's public surface against the deployed app (SQLite and PostgreSQL, plus one deployment
with an admin key, public docs and a public base URL): every route the app registers refuses a
missing or wrong key and answers 404 for another account's object; the schema and docs need a key
and never list the admin API without an admin key; each route's body is bounded; unknown names
are echoed only when short; redirects never take the request's Host; download tokens reveal
nothing and answer 404 when tampered with or expired."""

from __future__ import annotations

import base64
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from openft.errors import ECHOED_NAME_CHARS
from serve_app.app import create_app
from serve_app.request_body import BODY_LIMITS, DEFAULT_BODY_LIMIT, limit_of
from serve_app.services.blob_tokens import Blob, seal
from serve_app.state import AppState
from tests.conftest import ADMIN_KEY
from tests.factories import batch_request_line, chat_row, db_create_job, db_export, db_ft_model, jsonl

pytestmark = pytest.mark.usefixtures("ray_cluster")
DASHBOARD_ROUTES = {"redirect_to_dashboard", "read_dashboard", "read_dashboard_asset"}
WRONG_KEY = "sk-openft-not-a-key"
EXPORT = {"config.json": b'{"model_type": "qwen2"}', "LICENSE": b"Apache-2.0\n" * 40}
PARAM = re.compile(r"{(\w+)(?::\w+)?}")


@dataclass
class Owned:
    """Account A's objects, and account B's key (B owns nothing)."""

    root: str  # the app's URL without /v1
    state: AppState
    account_id: str
    key: str
    other_key: str
    file_id: str
    job_id: str
    model: str
    export_prefix: str
    batch_id: str  # -- batches (issue 13) --
    webhook_endpoint_id: str
    eval_id: str  # -- evals (issue 25) --
    run_id: str  # a run of the eval (queued: no controller drives this deployment)
    key_id: str  # A's API key (issue 24)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))

    def url(self, path: str) -> str:
        return self.root + path

    def call(self, method: str, path: str, key: str | None, **kw) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return self.http.request(method, self.url(path), headers={**headers, **kw.pop("headers", {})}, **kw)

    def fill(self, path: str) -> str:
        values = {"file_id": self.file_id, "fine_tuning_job_id": self.job_id, "model": self.model,
                  "account": self.account_id, "name": "adapter_config.json", "path": "config.json",
                  "batch_id": self.batch_id, "webhook_endpoint_id": self.webhook_endpoint_id,
                  "eval_id": self.eval_id, "run_id": self.run_id, "output_item_id": "outputitem_" + "0" * 28,
                  "key_id": self.key_id}  # fmt: skip
        return PARAM.sub(lambda m: values[m.group(1)], path)


def _owned(api) -> Owned:
    state = AppState.from_settings(api.settings)
    account_id, key = api.create_account()
    _, other_key = api.create_account()
    uploaded = api.client(key).files.create(file=("t.jsonl", jsonl([chat_row()] * 12)), purpose="fine-tune")
    job_id = db_create_job(state.db, account_id, uploaded.id)
    model = db_ft_model(state.db, state.store, account_id)
    prefix = db_export(state.db, state.store, account_id, model, EXPORT)
    requests = api.client(key).files.create(file=("b.jsonl", jsonl([batch_request_line("r", model=model)])),
                                            purpose="batch")
    batch = api.client(key).batches.create(input_file_id=requests.id, endpoint="/v1/chat/completions",
                                           completion_window="24h")
    hook = api.client(key).webhooks.create(name="s", url="https://example.com/hook", event_types=["batch.completed"])
    made = api.client(key).evals.create(
        data_source_config={"type": "custom", "item_schema": {"type": "object"}, "include_sample_schema": True},
        testing_criteria=[{"type": "string_check", "name": "c", "input": "{{sample.output_text}}", "reference": "x",
                           "operation": "eq"}])
    run = api.client(key).evals.runs.create(made.id, data_source={"type": "jsonl", "source": {
        "type": "file_content", "content": [{"item": {}, "sample": {"output_text": "x"}}]}})
    [api_key] = api.client(key).get("/gridline/api_keys", cast_to=object)["data"]
    return Owned(api.base_url.removesuffix("/v1"), state, account_id, key, other_key, uploaded.id, job_id, model, prefix,
                 batch.id, hook.id, made.id, run.id, api_key["id"])


@pytest.fixture(scope="module")
def owned(api) -> Owned:
    made = _owned(api)
    yield made
    made.http.close()
    made.state.db.dispose()


@pytest.fixture(scope="module")
def surface_owned(admin_api) -> Owned:
    """On the deployment with an admin key, public docs and a public base URL."""
    made = _owned(admin_api)
    yield made
    made.http.close()
    made.state.db.dispose()


def routes(state: AppState) -> list[tuple[str, str, str]]:
    """(method, path, name) of every route the app registers."""
    app = create_app(state.settings, state)
    return [(m, r.path, r.name) for r in iter_route_contexts(app.routes) for m in sorted(r.methods or ())]


def refused(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, (response.request.url, response.text)
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), (response.request.url, error)
    return error


def state_of(owned: Owned) -> tuple:
    """What A and B hold, to show that refused requests created and deleted nothing."""

    def a(path: str) -> dict:
        return owned.call("GET", path, owned.key).json()

    def b(path: str) -> list:
        return owned.call("GET", path, owned.other_key).json()["data"]

    return (
        [f["id"] for f in a("/v1/files")["data"]], [(j["id"], j["status"]) for j in a("/v1/fine_tuning/jobs")["data"]],
        a(f"/v1/models/{owned.model}")["id"], a(f"/v1/gridline/adapters/{owned.model}/merged")["status"],
        b("/v1/files"), b("/v1/fine_tuning/jobs"), [m["id"] for m in b("/v1/models") if m["id"].startswith("ft:")],
        a(f"/v1/batches/{owned.batch_id}")["status"], b("/v1/batches"),
        [(e["id"], e["url"], e["updated_at"]) for e in a("/v1/webhook_endpoints")["data"]], b("/v1/webhook_endpoints"),
        [k["id"] for k in a("/v1/gridline/api_keys")["data"]], [k["id"] for k in b("/v1/gridline/api_keys")],
    )


# -- every route: 401 without a key or with a wrong one, 404 for another account's object ----------
def test_every_route_needs_a_key_and_hides_other_accounts_objects(owned):
    before = state_of(owned)
    assert owned.file_id in before[0] and len(before[0]) == 2  # the upload and the batch's input file
    assert before[3] == "succeeded" and before[4:9] == ([], [], [], "validating", [])
    assert [e[0] for e in before[9]] == [owned.webhook_endpoint_id] and before[10] == []
    checks, seen = [], set()
    for method, path, name in routes(owned.state):
        seen.add(name)
        if name == "download_blob":  # the token is the credential: see the token tests below
            continue
        if name in DASHBOARD_ROUTES:  # static files; the page's API calls carry the key (tests/serve_app/test_dashboard.py)
            continue
        url = owned.fill(path)
        if path.startswith("/v1/gridline/admin/"):  # no admin key configured: the admin API does not exist
            checks += [(method, url, key, 404, "not_found", None) for key in (None, WRONG_KEY, owned.key)]
            continue
        checks += [(method, url, None, 401, "missing_api_key", None), (method, url, WRONG_KEY, 401, "invalid_api_key", None)]
        params = PARAM.findall(path)
        if params:  # the first path parameter names the object, which is A's and never B's
            checks.append((method, url, owned.other_key, 404, "not_found", params[0]))

    def check(case) -> None:
        method, url, key, status, code, param = case
        answer = owned.call(method, url, key, **({"json": {}} if method == "POST" else {}))
        if method == "HEAD":  # the status a GET would answer, without its body
            assert (answer.status_code, answer.content) == (status, b""), (url, answer.status_code)
        else:
            refused(answer, status, code, param)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, checks))
    assert {"create_file", "create_fine_tuning_job", "read_openapi_schema", "read_swagger_ui", "download_blob"} <= seen
    assert len(checks) > 70
    assert state_of(owned) == before


def test_the_schema_and_docs_need_a_key_and_hide_the_admin_api(owned, api):
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        refused(owned.call("GET", path, None), 401, "missing_api_key")
        assert owned.call("GET", path, owned.key).status_code == 200
    schema = owned.call("GET", "/openapi.json", owned.key).json()
    assert schema["servers"] == [{"url": f"/{api.name}"}]  # the Serve route prefix, for the docs' requests
    assert "/v1/fine_tuning/jobs" in schema["paths"] and not [p for p in schema["paths"] if "/admin/" in p]
    assert f'/{api.name}/openapi.json' in owned.call("GET", "/docs", owned.key).text
    # In-process, for tools: the same schema, and the admin routes once an admin key is set.
    assert create_app(owned.state.settings, owned.state).openapi()["paths"].keys() == schema["paths"].keys()
    with_admin = owned.state.settings.model_copy(update={"admin_key": "k"})
    assert [p for p in create_app(with_admin, owned.state).openapi()["paths"] if "/admin/" in p]


def test_public_docs_setting_and_the_admin_api_with_its_key(surface_owned):
    o = surface_owned
    schema = o.call("GET", "/openapi.json", None).json()  # OPENFT_API_DOCS_PUBLIC: no key needed
    assert len([p for p in schema["paths"] if p.startswith("/v1/gridline/admin/")]) == 6
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert o.call("GET", path, None).status_code == 200
    admin_routes = [(m, p) for m, p, _ in routes(o.state) if p.startswith("/v1/gridline/admin/")]
    assert len(admin_routes) == 7
    for method, path in admin_routes:
        body = {"json": {"usd": 5, "name": "k"}} if method == "POST" else {}
        for key in (None, WRONG_KEY, o.key):
            refused(o.call(method, o.fill(path), key, **body), 401, "invalid_api_key")
    assert o.call("GET", f"/v1/gridline/admin/accounts/{o.account_id}", ADMIN_KEY).json()["balance_usd"] == 0.0


# -- bounded bodies ------------------------------------------------------------------------------
def _raw(o: Owned, head: str, chunks: list[bytes] = ()) -> tuple[int, bytes]:
    """One request over a socket of its own; returns (status, body) once the server has closed it."""
    url = urlsplit(o.root)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head.encode())
        for chunk in chunks:
            sock.sendall(chunk)
        data = b""
        while block := sock.recv(65536):  # a timeout here: the server kept the connection open
            data += block
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), body


def test_the_docs_check_reads_the_routes_the_app_registers(tmp_path):
    # tests/test_docs.py reads the routes from the routers' source (importing the app imports Ray):
    # the same set as the app's own, so that its check of the pages' paths is a check against the app.
    from openft.settings import Settings
    from storage.db import Database
    from storage.objects import open_object_store
    from tests.test_docs import app_routes

    settings = Settings(data_dir=tmp_path)
    state = AppState(settings, Database(settings.resolved_database_url(), migrate=False),
                     open_object_store(settings.resolved_storage_url()))
    assert app_routes() == {(method, path) for method, path, _ in routes(state)}


def test_each_routes_body_is_bounded(owned):
    names = {name for _, _, name in routes(owned.state)}
    assert set(BODY_LIMITS) <= names  # the table names only routes that exist
    before = state_of(owned)
    posts = [(p, n) for m, p, n in routes(owned.state) if m == "POST" and limit_of(n) is not None]
    assert len(posts) >= 8
    for path, name in posts:
        limit = limit_of(name)
        response = owned.call("POST", owned.fill(path), owned.key, content=b" " * (limit + 1))
        error = refused(response, 413, "request_too_large")
        assert f"{limit:,} bytes" in error["message"], name
    for name, path in (("create_fine_tuning_job", "/v1/fine_tuning/jobs"), ("distill_files", "/v1/files/distill")):
        limit = limit_of(name)
        exact = b'{"pad": "' + b"x" * (limit - 11) + b'"}'
        assert len(exact) == limit  # the limit itself is allowed: refused for its content, not its size
        refused(owned.call("POST", path, owned.key, content=exact), 400, "unknown_parameter", "pad")
    assert limit_of("create_fine_tuning_job") == 1024 * 1024 and limit_of("distill_files") == 64 * 1024
    assert state_of(owned) == before


def test_declared_and_chunked_bodies_past_the_limit(owned):
    path = urlsplit(owned.url("/v1/fine_tuning/jobs")).path
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {owned.key}\r\nContent-Type: application/json\r\n"
    # 10 GiB declared and not one byte sent: the answer comes at once, and the server hangs up.
    status, body = _raw(owned, head + "Content-Length: 10737418240\r\n\r\n")
    assert status == 413 and b'"request_too_large"' in body
    chunk = b" " * 65536
    framed = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"] * 16 + [b"1\r\n \r\n0\r\n\r\n"]  # 1 MiB + 1, no length
    status, body = _raw(owned, head + "Transfer-Encoding: chunked\r\n\r\n", framed)
    assert status == 413 and b'"request_too_large"' in body
    assert [j["id"] for j in owned.call("GET", "/v1/fine_tuning/jobs", owned.key).json()["data"]] == [owned.job_id]


def test_admin_bodies_are_bounded_and_unknown_names_capped(surface_owned):
    o = surface_owned
    path = f"/v1/gridline/admin/accounts/{o.account_id}/credits"
    big = b'{"usd": 5, "note": "' + b"n" * DEFAULT_BODY_LIMIT + b'"}'
    json_type = {"content-type": "application/json"}
    refused(o.call("POST", path, ADMIN_KEY, content=big, headers=json_type), 413, "request_too_large")
    long_key = "k" * (ECHOED_NAME_CHARS + 1)
    error = refused(o.call("POST", path, ADMIN_KEY, json={"usd": 5, long_key: 1}), 400, "unknown_parameter")
    assert long_key not in error["message"]
    refused(o.call("POST", path, ADMIN_KEY, json={"usd": 5, "colour": 1}), 400, "unknown_parameter", "colour")
    assert o.call("GET", f"/v1/gridline/admin/accounts/{o.account_id}", ADMIN_KEY).json()["balance_usd"] == 0.0


# -- echoed names ------------------------------------------------------------------------------------
def test_unknown_names_are_echoed_only_when_short(owned):
    before = state_of(owned)
    at_cap, past_cap = "k" * ECHOED_NAME_CHARS, "k" * (ECHOED_NAME_CHARS + 1)
    job = {"model": "qwen2.5-0.5b-instruct", "training_file": owned.file_id}
    cases = [
        ("/v1/fine_tuning/jobs", {**job, at_cap: 1}, at_cap),
        ("/v1/fine_tuning/jobs", {**job, past_cap: 1}, None),
        ("/v1/fine_tuning/jobs", {**job, "hyperparameters": {past_cap: 1}}, "hyperparameters"),
        ("/v1/fine_tuning/jobs", {**job, "method": {"type": "supervised", past_cap: {}}}, "method"),
        ("/v1/fine_tuning/jobs", {**job, "method": {"type": "dpo", "dpo": {"hyperparameters": {past_cap: 1}}}},
         "method.dpo.hyperparameters"),
        ("/v1/files/distill", {at_cap: 1}, at_cap),
        ("/v1/files/distill", {past_cap: 1}, None),
    ]
    for path, body, param in cases:
        error = refused(owned.call("POST", path, owned.key, json=body), 400, "unknown_parameter", param)
        assert (at_cap in error["message"]) == (param == at_cap)
    # The amplification: a key of nearly the whole 1 MiB body answers in a few hundred bytes.
    huge = owned.call("POST", "/v1/fine_tuning/jobs", owned.key, json={**job, "k" * 1_000_000: 1})
    refused(huge, 400, "unknown_parameter")
    assert len(huge.content) < 400
    assert state_of(owned) == before


# -- redirects and download tokens ---------------------------------------------------------------
HOSTILE = {"host": "evil.example", "x-forwarded-proto": "https", "x-forwarded-host": "evil.example",
           "forwarded": "host=evil.example;proto=https"}  # fmt: skip


def _location(o: Owned, path: str) -> str:
    r = o.call("GET", f"/v1/gridline/adapters/{o.model}/merged/files/{path}", o.key, headers=HOSTILE)
    assert r.status_code == 302, r.text
    assert "evil" not in r.headers["location"]
    return r.headers["location"]


def test_redirects_never_name_the_requests_host(owned, surface_owned, api):
    location = _location(owned, "config.json")  # no public_base_url: relative, under the route prefix
    assert location.startswith(f"/{api.name}/v1/gridline/blobs/")
    assert httpx.get(urljoin(owned.root, location)).content == EXPORT["config.json"]
    assert _location(surface_owned, "config.json").startswith("https://ft.example.com/openft/v1/gridline/blobs/")


def _b64(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def test_download_tokens_reveal_nothing_and_refuse_tampering_and_expiry(owned):
    location = _location(owned, "config.json")
    blobs, token = location.rpartition("/")[0] + "/", location.rpartition("/")[2]
    other = _location(owned, "LICENSE").rpartition("/")[2]

    def get(t: str) -> httpx.Response:
        return httpx.get(urljoin(owned.root, blobs + t))

    needles = [owned.account_id, owned.export_prefix, owned.export_prefix.split("/")[-1], "config.json", "merges/"]
    for needle in needles:
        assert needle not in token and needle.encode() not in _b64(token), needle
    assert _location(owned, "config.json").rpartition("/")[2] != token  # no two links alike

    assert get(token).content == EXPORT["config.json"] and get(other).content == EXPORT["LICENSE"]
    raw = _b64(token)
    tampered = [
        token[:-1], token[:-4], token[: len(token) // 2], token[:16], token + "A", "A" + token,
        token[: len(token) // 2] + other[len(token) // 2:], other[: len(other) // 2] + token[len(token) // 2:],
        *(token[:i] + ("B" if token[i] == "A" else "A") + token[i + 1:] for i in (0, len(token) // 2, len(token) - 1)),
        *(base64.urlsafe_b64encode(raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1:]).rstrip(b"=").decode()
          for i in (0, 12, len(raw) - 1)),  # a bit of the nonce, the ciphertext, the tag
        token.replace(token[5], "=", 1), "x" * 5000,
    ]  # fmt: skip
    for t in tampered:
        refused(get(t), 404, "not_found")

    secret, now = owned.state.settings.resolved_signing_secret(), int(time.time())
    blob = Blob(f"{owned.export_prefix}/config.json", "0" * 64, len(EXPORT["config.json"]), "config.json", now + 300)
    assert get(seal(secret, blob)).content == EXPORT["config.json"]
    refused(get(seal(secret, replace(blob, expires=now - 1))), 404, "not_found")
    refused(get(seal(b"another secret", blob)), 404, "not_found")
    assert get(token).status_code == 200  # every refusal above left the real link working
