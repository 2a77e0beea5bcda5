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
