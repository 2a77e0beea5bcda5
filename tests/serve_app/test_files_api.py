"""The Files API through the official `openai` SDK against the Serve app (SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
import io

import httpx
import openai
import orjson
import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from serve_app.services.retention import reap_once
from serve_app.state import AppState
from tests.conftest import redeploy

GOOD = tickets_jsonl(ticket_splits()[0][:30])
MARKER = "ZQX-SECRET-ROW-TEXT"


def _line(obj) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _chat(user=MARKER, assistant="ok", **extra) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}], **extra}


def _file_with_bad_line(bad: bytes, at: int = 3) -> bytes:
    good = [_line(_chat()) for _ in range(5)]
    good.insert(at - 1, bad)
    return b"".join(good)


def _upload(client, data: bytes, purpose="fine-tune", name="train.jsonl"):
    return client.files.create(file=(name, io.BytesIO(data)), purpose=purpose)


def _stored_keys(api, account_id: str) -> list[str]:
    state = AppState.from_settings(api.settings)
    return list(state.store.list(f"files/{account_id}/"))


BAD_LINES = {
    "invalid_json": b'{"messages": [\n',
    "invalid_messages": _line({"messages": [{"role": "user", "content": MARKER}]}),
    "unsupported_field": _line(_chat(tools=[{"type": "function"}])),
    "line_too_large": _line(_chat(user=MARKER + "x" * (1024 * 1024))),
    "too_many_messages": _line(
        {"messages": [{"role": "user", "content": MARKER}, {"role": "assistant", "content": "a"}] * 513}
    ),
    "mixed_row_kinds": _line({
        "input": {"messages": [{"role": "user", "content": MARKER}]},
        "preferred_output": [{"role": "assistant", "content": "a"}],
        "non_preferred_output": [{"role": "assistant", "content": "b"}],
    }),
}


def test_upload_records_counts_and_checksum(account):
    client, _, _ = account
    f = _upload(client, GOOD)
    assert f.id.startswith("file-") and f.object == "file" and f.purpose == "fine-tune"
    assert f.bytes == len(GOOD) and f.status == "processed" and f.filename == "train.jsonl"
    assert f.expires_at == f.created_at + 30 * 86400
    extra = f.model_extra["gridline"]
    assert extra["sha256"] == hashlib.sha256(GOOD).hexdigest()
    assert extra["row_kind"] == "chat" and extra["rows"] == 30 and extra["messages"] == 90
    estimates = extra["token_estimates"]
    assert set(estimates) >= {"qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "gpt-oss-20b"}
    assert all(0 < v <= extra["token_upper_bound"] for v in estimates.values())
    assert client.files.retrieve(f.id).model_extra["gridline"] == extra


@pytest.mark.parametrize("code", sorted(BAD_LINES))
def test_each_validation_code_names_the_line_and_creates_nothing(api, account, code):
    client, account_id, _ = account
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, _file_with_bad_line(BAD_LINES[code], at=3))
    err = info.value.body
    assert info.value.status_code == 400
    assert err["code"] == code and err["param"] == "file"
    assert "line 3" in err["message"] and MARKER not in err["message"]
    assert client.files.list().data == []
    assert _stored_keys(api, account_id) == []


def test_empty_file_and_preference_rules(account):
    client, _, _ = account
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, b"")
    assert info.value.body["code"] == "empty_file"
    same = {"input": {"messages": [{"role": "user", "content": "q"}]},
            "preferred_output": [{"role": "assistant", "content": "a"}],
            "non_preferred_output": [{"role": "assistant", "content": "a"}]}
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, _line(same))
    assert info.value.body["code"] == "invalid_preference_row" and "line 1" in info.value.body["message"]


def test_file_too_large_is_413(api, account):
    client, account_id, _ = account
    row = _line(_chat(user="y" * 60_000))
    data = row * (64 * 1024 * 1024 // len(row) + 2)
    with pytest.raises(openai.APIStatusError) as info:
        _upload(client, data)
    assert info.value.status_code == 413 and info.value.body["code"] == "file_too_large"
    assert _stored_keys(api, account_id) == []


def test_large_file_validated_on_ray_data_reports_first_bad_line(api, account):
    """Above the 8 MiB threshold the tail is validated by the Ray Data job."""
    client, account_id, _ = account
    row = _line(_chat(user="z" * 4000))
    n = 9 * 1024 * 1024 // len(row)
    lines = [row] * n
    lines[n - 5] = BAD_LINES["invalid_messages"]
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, b"".join(lines))
    assert info.value.body["code"] == "invalid_messages"
    assert f"line {n - 4}" in info.value.body["message"]
    assert _stored_keys(api, account_id) == []
    ok = _upload(client, row * n)
    assert ok.model_extra["gridline"]["rows"] == n


def test_content_round_trips_byte_identical(account):
    client, _, _ = account
    data = _line(_chat(user="héllo ☃ \u2028 end", assistant="naïve")) * 12
    f = _upload(client, data)
    got = client.files.content(f.id)
    assert got.content == data
    assert got.response.headers["x-gridline-sha256"] == hashlib.sha256(data).hexdigest()


def test_batch_purposes(account):
    client, _, _ = account
    req = _line({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}})
    assert _upload(client, req * 3, purpose="batch").purpose == "batch"
    assert _upload(client, _line({"custom_id": "a", "response": None}), purpose="batch_output").purpose == "batch_output"
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, req + _line({"method": "POST"}), purpose="batch")
    assert info.value.body["code"] == "invalid_batch_line" and "line 2" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        _upload(client, req, purpose="assistants")
    assert info.value.body["param"] == "purpose"


def test_list_paginates_filters_and_orders(account):
    client, _, _ = account
    ids = [_upload(client, GOOD).id for _ in range(3)]
    batch_id = _upload(client, _line({"custom_id": "x"}), purpose="batch").id
    page = client.files.list(limit=2, order="asc", purpose="fine-tune")
    assert [f.id for f in page.data] == ids[:2] and page.has_more
    rest = client.files.list(limit=2, order="asc", purpose="fine-tune", after=ids[1])
    assert [f.id for f in rest.data] == ids[2:] and not rest.has_more
    assert [f.id for f in client.files.list(order="desc").data] == [batch_id, *reversed(ids)]
    # Iterating a page makes the SDK follow `after` cursors page by page.
    assert [f.id for f in client.files.list(order="asc", limit=1)] == [*ids, batch_id]


def test_delete_removes_row_and_bytes(api, account):
    client, account_id, _ = account
    f = _upload(client, GOOD)
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert _stored_keys(api, account_id) == []
    with pytest.raises(openai.NotFoundError):
        client.files.delete(f.id)


def test_auth_required_on_every_route(api, account):
    client, _, _ = account
    f = _upload(client, GOOD)
    routes = [("GET", "/files"), ("POST", "/files"), ("GET", f"/files/{f.id}"),
              ("GET", f"/files/{f.id}/content"), ("DELETE", f"/files/{f.id}")]
    for headers in ({}, {"Authorization": "Bearer sk-openft-wrong"}, {"Authorization": "Basic abc"}):
        for method, path in routes:
            r = httpx.request(method, api.base_url + path, headers=headers)
            assert r.status_code == 401, (method, path)
            assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        api.client("sk-openft-nope").files.list()
    assert client.files.retrieve(f.id).id == f.id


def test_other_accounts_get_404_on_every_route(api, account):
    client, _, _ = account
    f = _upload(client, GOOD)
    _, other_key = api.create_account()
    other = api.client(other_key)
    assert other.files.list().data == []
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError) as info:
            call(f.id)
        assert info.value.body["code"] == "not_found"
    assert client.files.content(f.id).content == GOOD


def test_purpose_after_file_part_is_validated_too(api, account):
    """curl -F file=@x -F purpose=fine-tune sends the file first."""
    client, _, key = account
    bad = _file_with_bad_line(BAD_LINES["invalid_messages"], at=2)
    body = httpx.post(api.base_url + "/files", headers={"Authorization": f"Bearer {key}"},
                      files=[("file", ("t.jsonl", bad)), ("purpose", (None, "fine-tune"))])
    assert body.status_code == 400 and body.json()["error"]["code"] == "invalid_messages"
    ok = httpx.post(api.base_url + "/files", headers={"Authorization": f"Bearer {key}"},
                    files=[("file", ("t.jsonl", GOOD)), ("purpose", (None, "fine-tune"))])
    assert ok.status_code == 200 and ok.json()["gridline"]["rows"] == 30
    assert [f.id for f in client.files.list().data] == [ok.json()["id"]]


def test_files_survive_a_restart(api, account, serve_port):
    client, _, key = account
    f = _upload(client, GOOD)
    restarted = redeploy(api, serve_port)
    again = restarted.client(key)
    assert again.files.retrieve(f.id).model_extra["gridline"]["sha256"] == hashlib.sha256(GOOD).hexdigest()
    assert again.files.content(f.id).content == GOOD


def test_expired_files_are_reaped(api, account):
    client, account_id, _ = account
    f = _upload(client, GOOD)
    state = AppState.from_settings(api.settings)
    reap_once(state, now=f.expires_at - 1)
    assert client.files.retrieve(f.id).id == f.id
    assert reap_once(state, now=f.expires_at)["files"] >= 1
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert _stored_keys(api, account_id) == []
    assert reap_once(state, now=f.expires_at)["files"] == 0
