"""HTTP Range on the download routes (issue 16: `openft models download` resumes), through the
deployed API: an `ft:` model's adapter file and a merged-weights blob link, answered 206 with the
span asked for and the whole file's SHA-256; a range past the end is 416, another account's model
404 whatever the Range; a Range this server does not serve gets the whole file (200)."""

from __future__ import annotations

import hashlib
import os
import time

import httpx
import pytest

from openft.errors import RangeNotSatisfiable
from serve_app.downloads import ByteRange
from serve_app.services.blob_tokens import Blob, seal
from serve_app.state import AppState
from storage.models import FineTunedModel
from tests.factories import db_job_with_checkpoints

DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()
NAME = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def stored(apis):
    """An account's registered model whose adapter weights are DATA, as registration stores them."""
    api = apis("sqlite")
    state = AppState.from_settings(api.settings)
    account_id, key = api.create_account()
    _, other_key = api.create_account()
    job_id, model = db_job_with_checkpoints(state.db, account_id, [])
    with state.db.session() as session:
        row = session.get(FineTunedModel, model)
        prefix = row.adapter_prefix
        row.files = {NAME: {"sha256": SHA, "bytes": len(DATA)},
                     "adapter_config.json": {"sha256": hashlib.sha256(b"{}").hexdigest(), "bytes": 2}}  # fmt: skip
    state.store.put_bytes(f"{prefix}/{NAME}", DATA)
    yield api, state, model, key, other_key, f"{prefix}/{NAME}"
    state.db.dispose()


def _get(api, path: str, key: str | None, range_: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if range_:
        headers["Range"] = range_
    return httpx.get(f"{api.base_url}/gridline/{path}", headers=headers, timeout=60)


@pytest.mark.parametrize("range_, start, end", [(None, 0, len(DATA)), ("bytes=123457-", 123457, len(DATA)),
                                                ("bytes=5-9", 5, 10), ("bytes=-1000", len(DATA) - 1000, len(DATA))])  # fmt: skip
def test_an_adapter_download_answers_the_span_asked_for(stored, range_, start, end):
    api, _, model, key, _, _ = stored
    r = _get(api, f"adapters/{model}/files/{NAME}", key, range_)
    assert r.status_code == (206 if range_ else 200)
    assert r.content == DATA[start:end] and r.headers["content-length"] == str(end - start)
    assert r.headers["x-gridline-sha256"] == SHA and r.headers["accept-ranges"] == "bytes"
    if range_:
        assert r.headers["content-range"] == f"bytes {start}-{end - 1}/{len(DATA)}"


def test_a_range_past_the_end_is_refused_and_another_accounts_model_is_not_found(stored):
    api, _, model, key, other_key, _ = stored
    r = _get(api, f"adapters/{model}/files/{NAME}", key, f"bytes={len(DATA)}-")
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(DATA)}"
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("range_not_satisfiable", "range", "invalid_request_error")
    r = _get(api, f"adapters/{model}/files/{NAME}", other_key, "bytes=0-9")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_several_ranges_get_the_whole_file(stored):
    api, _, model, key, _, _ = stored
    r = _get(api, f"adapters/{model}/files/{NAME}", key, "bytes=0-1,5-6")
    assert r.status_code == 200 and r.content == DATA


def test_a_merged_weights_link_answers_a_range(stored):
    api, state, _, _, _, object_key = stored
    token = seal(state.settings.resolved_signing_secret(),
                 Blob(key=object_key, sha256=SHA, size=len(DATA), name="model.safetensors", expires=int(time.time()) + 600))  # fmt: skip
    r = _get(api, f"blobs/{token}", None, "bytes=200000-")
    assert r.status_code == 206 and r.content == DATA[200000:] and r.headers["x-gridline-sha256"] == SHA
    assert _get(api, f"blobs/{token}", None, f"bytes={len(DATA) + 5}-").status_code == 416


# -- issue 24: numbers bounded before they are converted, messages that say what was wrong, HEAD --
DIGITS = "9" * 4301  # one past Python's int() limit of 4,300 digits
MANY = "9" * 60  # past any file's end, within the header's bound


@pytest.mark.parametrize("header", [f"bytes={DIGITS}-", f"bytes=0-{DIGITS}", f"bytes=-{DIGITS}", "bytes=" + "0" * 300 + "7-"])
def test_a_range_header_longer_than_any_single_range_is_ignored(header):
    assert ByteRange.parse(header) is None  # RFC 9110: the whole file, 200


@pytest.mark.parametrize("header, span", [
    (f"bytes={MANY}-", None), (f"bytes=0-{MANY}", (0, 100)), (f"bytes=-{MANY}", (0, 100)),
    ("bytes=" + "0" * 100 + "7-", (7, 100)), (f"bytes=5-{'0' * 30}9", (5, 10)),
])
def test_a_range_position_of_many_digits_counts_as_past_any_end(header, span):
    ranged = ByteRange.parse(header)
    if span is None:
        with pytest.raises(RangeNotSatisfiable) as info:
            ranged.span(100)
        assert "past any file's end" in info.value.message
    else:
        assert ranged.span(100) == span


@pytest.mark.parametrize("header, said", [
    ("bytes=-0", "bytes=-0 asks for the last 0 bytes"), ("bytes=100-", "starts at byte 100, at or past the file's end "
                                                                      "(100 bytes)"),
])
def test_a_416_says_what_was_wrong(header, said):
    with pytest.raises(RangeNotSatisfiable) as info:
        ByteRange.parse(header).span(100)
    assert said in info.value.message and info.value.headers == {"content-range": "bytes */100"}
    with pytest.raises(RangeNotSatisfiable) as info:
        ByteRange.parse("bytes=-5").span(0)
    assert "empty" in info.value.message


def test_a_4301_digit_range_is_no_server_error(stored):
    api, _, model, key, _, _ = stored
    r = _get(api, "blobs/garbage", None, f"bytes={DIGITS}-")  # unauthenticated: the token is checked after
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = _get(api, f"adapters/{model}/files/{NAME}", key, f"bytes={DIGITS}-")
    assert r.status_code == 200 and r.content == DATA
    r = _get(api, f"adapters/{model}/files/{NAME}", key, f"bytes={MANY}-")
    assert (r.status_code, r.json()["error"]["code"]) == (416, "range_not_satisfiable")
    r = _get(api, f"adapters/{model}/files/{NAME}", key, f"bytes=0-{MANY}")
    assert r.status_code == 206 and r.content == DATA
    r = _get(api, f"adapters/{model}/files/{NAME}", key, "bytes=-0")
    assert r.status_code == 416 and "bytes=-0" in r.json()["error"]["message"]


def _head_matches_get(url: str, headers: dict) -> httpx.Response:
    got = httpx.get(url, headers=headers, timeout=60)
    probed = httpx.head(url, headers=headers, timeout=60)
    assert probed.status_code == got.status_code and probed.content == b""
    same = {k: v for k, v in got.headers.items() if k not in ("date", "x-request-id")}
    assert {k: v for k, v in probed.headers.items() if k not in ("date", "x-request-id")} == same
    return probed


def test_head_answers_what_get_would_on_every_download_route(stored):
    api, state, model, key, other_key, object_key = stored
    auth = {"Authorization": f"Bearer {key}"}
    base = f"{api.base_url}/gridline"
    probed = _head_matches_get(f"{base}/adapters/{model}/files/{NAME}", auth)
    assert (probed.status_code, probed.headers["content-length"]) == (200, str(len(DATA)))
    probed = _head_matches_get(f"{base}/adapters/{model}/files/{NAME}", {**auth, "Range": "bytes=5-9"})
    assert (probed.status_code, probed.headers["content-range"]) == (206, f"bytes 5-9/{len(DATA)}")
    assert _head_matches_get(f"{base}/adapters/{model}/files/{NAME}", {**auth, "Range": "bytes=-0"}).status_code == 416
    assert _head_matches_get(f"{base}/adapters/{model}/files/{NAME}",
                             {"Authorization": f"Bearer {other_key}"}).status_code == 404
    token = seal(state.settings.resolved_signing_secret(),
                 Blob(key=object_key, sha256=SHA, size=len(DATA), name="model.safetensors", expires=int(time.time()) + 600))  # fmt: skip
    probed = _head_matches_get(f"{base}/blobs/{token}", {})
    assert probed.headers["content-disposition"] == 'attachment; filename="model.safetensors"'
    assert _head_matches_get(f"{base}/blobs/garbage", {}).status_code == 404
    upload = api.client(key).files.create(file=("t.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
    probed = _head_matches_get(f"{api.base_url}/files/{upload.id}/content", auth)
    assert probed.headers["x-gridline-sha256"] == hashlib.sha256(b'{"custom_id": "a"}\n').hexdigest()
    r = httpx.head(f"{base}/adapters/{model}/merged/files/x.safetensors", headers=auth, timeout=60)
    assert r.status_code == httpx.get(f"{base}/adapters/{model}/merged/files/x.safetensors", headers=auth,
                                      timeout=60).status_code != 405
