"""The merged-weights API against the Serve app (SQLite and PostgreSQL), with the merge worker
called directly: a stand-in `ft:` model merges, every file downloads through its redirect with its
digest, the export loads and matches peft's merge_and_unload; expiry, DELETE of an export and of a
pending merge, DELETE while running (`merge_weights_gone`), the POST refusals, failed merges, the
limits and quotas, timeouts retried three times, and other accounts' 404s."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx
import openai
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from catalog.bases import get_base
from catalog.standins import MANIFEST, standin_dir
from jobs.model_names import model_name
from merge.quota import MAX_EXPORT_BYTES
from merge.run import ADAPTER_CONFIG, ADAPTER_MODEL
from merge.worker import EXPORT_TTL_S, claim_pending_merges, process_merge, run_pending_merges
from openft.ids import new_id
from serve_app.services.blob_tokens import Blob, seal
from serve_app.state import AppState
from storage.models import Account, FineTunedModel, Merge
from tests.merge.builders import Adapter, train_adapter

pytestmark = pytest.mark.usefixtures("ray_cluster")
BASE = get_base("qwen2.5-0.5b-instruct")
IDS = torch.tensor([[5, 17, 300, 2999, 42, 7, 1024, 64]])


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Adapter]:
    base_dir = standin_dir(BASE, tmp_path_factory.mktemp("merges-api-cache"))
    out = tmp_path_factory.mktemp("merges-api-adapters")
    good = train_adapter(base_dir, BASE, out)
    return {"good": good, "lm_head": train_adapter(base_dir, BASE, out, target_modules=["q_proj", "lm_head"])}


@dataclass
class Env:
    base_url: str
    state: AppState

    def register(self, account_id: str, adapter: Adapter) -> str:
        """Store an adapter and register it as the controller does after a job; returns the ft: name."""
        job = new_id("ftjob-", 32)
        prefix = f"runs/{job}/adapter"
        files = {ADAPTER_CONFIG: adapter.config, ADAPTER_MODEL: adapter.model}
        for name, data in files.items():
            self.state.store.put_bytes(f"{prefix}/{name}", data)
        with self.state.db.session() as s:
            name = model_name(BASE.id, s.get(Account, account_id).org_id, job)
            s.add(FineTunedModel(
                id=name, account_id=account_id, job_id=job, base=BASE.id, servable=True, adapter_prefix=prefix,
                files={n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in files.items()},
                created_at=int(time.time()), created_ns=time.time_ns(),
            ))  # fmt: skip
        return name

    def adapter_prefix(self, model: str) -> str:
        with self.state.db.session() as s:
            return s.get(FineTunedModel, model).adapter_prefix

    def call(self, key: str | None, method: str, model: str, path: str = "") -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, f"{self.base_url}/gridline/adapters/{model}/merged{path}", headers=headers)

    def row(self, account_id: str, model: str) -> Merge:
        with self.state.db.session() as s:
            return s.query(Merge).filter_by(account_id=account_id, model=model).order_by(Merge.created_ns.desc()).first()

    def work(self, now: int | None = None, settings=None) -> list[str]:
        return run_pending_merges(settings or self.state.settings, self.state.db, self.state.store,
                                  now=now or int(time.time()))  # fmt: skip


@pytest.fixture(scope="module")
def env(api) -> Env:
    state = AppState.from_settings(api.settings)
    yield Env(api.base_url, state)
    state.db.dispose()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_merge_downloads_load_and_match_peft(api, env, account, adapters, tmp_path):
    client, account_id, key = account
    model = env.register(account_id, adapters["good"])
    path = f"/gridline/adapters/{model}/merged"
    queued = client.post(path, cast_to=object)
    assert queued["object"] == "gridline.merged_weights" and queued["model"] == model
    assert (queued["status"], queued["files"], queued["error"], queued["finished_at"]) == ("queued", [], None, None)
    assert client.post(path, cast_to=object) == queued  # the same merge, not a second one

    assert env.work()
    done = client.get(path, cast_to=object)
    assert done["status"] == "succeeded" and done["error"] is None
    assert done["expires_at"] == done["finished_at"] + EXPORT_TTL_S
    listed = {f["path"]: f for f in done["files"]}
    base_dir = standin_dir(BASE, api.settings.model_cache_dir)
    base_files = json.loads((base_dir / MANIFEST).read_text())["files"]
    assert set(listed) == set(base_files) | {"LICENSE", "NOTICE", "gridline_merge.json"}

    out = tmp_path / "export"
    for name, entry in listed.items():
        redirect = httpx.get(f"{api.base_url}{path}/files/{name}", headers={"authorization": f"Bearer {key}"})
        assert redirect.status_code == 302 and redirect.headers["x-gridline-sha256"] == entry["sha256"]
        blob = httpx.get(urljoin(api.base_url, redirect.headers["location"]))  # no bearer key: the URL is the credential
        assert blob.status_code == 200, blob.text
        assert blob.headers["x-gridline-sha256"] == entry["sha256"] == _sha(blob.content)
        assert len(blob.content) == entry["bytes"]
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(blob.content)
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, follow_redirects=True) as http:
        assert http.get(f"{api.base_url}{path}/files/config.json").content == (out / "config.json").read_bytes()

    manifest = json.loads((out / "gridline_merge.json").read_text())
    assert manifest["modified"] == ["model.safetensors"]
    assert manifest["adapter"]["sha256"] == adapters["good"].sha256()
    for name, digest in base_files.items():
        if name != "model.safetensors":
            assert _sha((out / name).read_bytes()) == digest, name
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16), adapters["good"].write(tmp_path / "ad")
    ).merge_and_unload()
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, peft_model(IDS).logits)
        assert not torch.equal(ours(IDS).logits, AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)(IDS).logits)

    location = urljoin(api.base_url, httpx.get(f"{api.base_url}{path}/files/LICENSE",
                                               headers={"authorization": f"Bearer {key}"}).headers["location"])  # fmt: skip
    token = location.rpartition("/")[2]
    forged = location[: -len(token)] + ("A" if token[0] != "A" else "B") + token[1:]
    assert _error(httpx.get(forged), 404)["code"] == "not_found"
    entry, prefix = listed["LICENSE"], env.row(account_id, model).export_prefix
    stale = seal(api.settings.resolved_signing_secret(), Blob(f"{prefix}/LICENSE", entry["sha256"], entry["bytes"],
                                                              "LICENSE", int(time.time()) - 1))  # fmt: skip
    assert _error(httpx.get(location.rpartition("/")[0] + "/" + stale), 404)["code"] == "not_found"

    # Seven days on, the worker expires the export and deletes its objects; a POST merges again.
    env.work(now=int(time.time()) + 8 * 86400)
    expired = client.get(path, cast_to=object)
    assert (expired["status"], expired["files"]) == ("expired", [])
    assert list(env.state.store.list(prefix + "/")) == []
    assert _error(httpx.get(location), 404)["code"] == "not_found"
    assert _error(env.call(key, "GET", model, "/files/LICENSE"), 404)["code"] == "not_found"
    again = client.post(path, cast_to=object)
    assert again["status"] == "queued" and again["created_at"] >= done["created_at"]
    # DELETE of a pending merge cancels it: gone from the API, never picked up.
    assert env.call(key, "DELETE", model).json() == {"object": "gridline.merged_weights.deleted", "model": model, "deleted": True}
    assert _error(env.call(key, "GET", model), 404)["code"] == "not_found"
    env.work()
    cancelled = env.row(account_id, model)
    assert (cancelled.status, cancelled.attempts, cancelled.deleted_at is not None) == ("queued", 0, True)


def test_delete_while_running_and_delete_of_an_export(env, account, adapters):
    _, account_id, key = account
    model = env.register(account_id, adapters["good"])
    assert env.call(key, "POST", model).json()["status"] == "queued"
    (claim,) = claim_pending_merges(env.state.db, now=int(time.time()))
    assert env.call(key, "GET", model).json()["status"] == "running"
    assert env.call(key, "DELETE", model).json()["deleted"] is False
    assert process_merge(env.state.settings, claim, db=env.state.db, store=env.state.store) == "failed"
    gone = env.call(key, "GET", model).json()
    assert (gone["status"], gone["error"]["code"]) == ("failed", "merge_weights_gone")
    assert list(env.state.store.list(env.row(account_id, model).export_prefix + "/")) == []

    assert env.call(key, "POST", model).json()["status"] == "queued"  # after a failure, a POST merges again
    # As the controller runs it: in a thread of its own, the pass returning at once.
    assert len(run_pending_merges(env.state.settings, env.state.db, env.state.store, now=int(time.time()), background=True)) == 1
    deadline = time.monotonic() + 60
    while env.call(key, "GET", model).json()["status"] != "succeeded" and time.monotonic() < deadline:
        time.sleep(0.1)
    row = env.row(account_id, model)
    assert row.status == "succeeded" and len(list(env.state.store.list(row.export_prefix + "/"))) == len(row.files)
    assert env.call(key, "DELETE", model).json()["deleted"] is True
    assert _error(env.call(key, "GET", model), 404)["code"] == "not_found"
    assert list(env.state.store.list(row.export_prefix + "/")) == []
    assert env.row(account_id, model).purged_at is not None


def test_refusals_answer_400_and_record_nothing(env, account, adapters):
    _, account_id, key = account
    good = adapters["good"]
    cases = {
        "merge_tied_lm_head": adapters["lm_head"],
        "merge_base_revision": good.with_config(revision="0" * 40),
        "merge_base_unknown": good.with_config(base_model_name_or_path="someone/some-model"),
    }
    for code, adapter in cases.items():
        model = env.register(account_id, adapter)
        error = _error(env.call(key, "POST", model), 400)
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_request", "model")
        assert error["message"].startswith(f"This adapter cannot be merged ({code}).")
        assert _error(env.call(key, "GET", model), 404)["code"] == "not_found"
        assert env.row(account_id, model) is None


def test_broken_adapters_fail_with_their_code(env, account, adapters):
    _, account_id, key = account
    good = adapters["good"]
    tensors = good.tensors()
    first_b = next(k for k in tensors if ".lora_B." in k)
    cases = {
        "merge_adapter_dtype": good.with_tensors({**tensors, first_b: tensors[first_b].to(torch.int32)}),
        "merge_adapter_header": Adapter(good.config, good.model[:40]),
        "merge_adapter_pair": good.with_tensors({k: v for k, v in tensors.items() if k != first_b}),
        "merge_rank": good.with_config(r=BASE.max_rank + 1),
    }
    for code, adapter in cases.items():
        model = env.register(account_id, adapter)
        failed = env.call(key, "POST", model).json()
        assert (failed["status"], failed["error"]["code"]) == ("failed", code)
        assert failed["finished_at"] is not None and env.call(key, "GET", model).json() == failed

    missing = env.register(account_id, good)
    env.state.store.delete(f"{env.adapter_prefix(missing)}/{ADAPTER_MODEL}")
    assert env.call(key, "POST", missing).json()["error"]["code"] == "merge_adapter_unavailable"

    # The adapter's files change between the POST and the merge.
    changed = env.register(account_id, good)
    assert env.call(key, "POST", changed).json()["status"] == "queued"
    env.state.store.put_bytes(f"{env.adapter_prefix(changed)}/{ADAPTER_MODEL}", good.with_tensors({k: v * 2 for k, v in tensors.items()}).model)
    env.work()
    assert env.call(key, "GET", changed).json()["error"]["code"] == "merge_adapter_changed"


def test_one_at_a_time_and_ten_a_day(env, account, adapters):
    _, account_id, key = account
    first, second = env.register(account_id, adapters["good"]), env.register(account_id, adapters["good"])
    broken = env.register(account_id, adapters["good"].with_config(r=BASE.max_rank + 1))
    assert env.call(key, "POST", first).json()["status"] == "queued"
    error = _error(env.call(key, "POST", second), 429)
    assert (error["code"], error["limit"]) == ("limit_exceeded", {"limit": 1, "current": 1})
    assert env.call(key, "DELETE", first).json()["deleted"] is True
    for _ in range(9):  # with the cancelled one, ten accepted today
        assert env.call(key, "POST", broken).json()["status"] == "failed"
    error = _error(env.call(key, "POST", second), 429)
    assert (error["code"], error["limit"]) == ("limit_exceeded", {"limit": 10, "current": 10})
    assert env.row(account_id, second) is None


def _held_export(env: Env, account_id: str, size: int) -> None:
    """An export as the worker records one (its objects are not needed to count against the quota)."""
    now = int(time.time())
    merge_id = new_id("merge-", 24)
    with env.state.db.session() as s:
        s.add(Merge(
            id=merge_id, account_id=account_id, model=f"ft:{BASE.id}:x:{merge_id[-12:]}", base=BASE.id,
            status="succeeded", export_prefix=f"merges/{account_id}/{merge_id}", adapter_sha256={}, attempts=1,
            files=[], bytes=size, delete_requested=False, created_at=now - 2 * 86400, created_ns=time.time_ns(),
            finished_at=now - 2 * 86400, expires_at=now + 5 * 86400,
        ))  # fmt: skip


def test_export_quota(api, env, adapters):
    account_id, key = api.create_account()
    model = env.register(account_id, adapters["good"])
    for _ in range(4):
        _held_export(env, account_id, 1000)
    error = _error(env.call(key, "POST", model), 429)
    assert (error["code"], error["limit"]) == ("merge_weights_quota", {"limit": 4, "current": 4})

    # Just under 64 GB held: the POST is accepted, and the merge fails once its size is known.
    account_id, key = api.create_account()
    model = env.register(account_id, adapters["good"])
    _held_export(env, account_id, MAX_EXPORT_BYTES - 1000)
    assert env.call(key, "POST", model).json()["status"] == "queued"
    env.work()
    failed = env.call(key, "GET", model).json()
    assert (failed["status"], failed["error"]["code"]) == ("failed", "merge_weights_quota")
    assert list(env.state.store.list(env.row(account_id, model).export_prefix + "/")) == []


def test_timeouts_are_retried_three_times(api, env, account, adapters):
    _, account_id, key = account
    model = env.register(account_id, adapters["good"])
    env.call(key, "POST", model)
    t = int(time.time())
    claim_pending_merges(env.state.db, now=t)  # a worker that claims it and is lost
    fast = api.settings.model_copy(update={"merge_deadline_seconds": 1e-6})
    env.work(now=t + 121, settings=fast)  # the lost attempt, then a second that times out
    row = env.row(account_id, model)
    assert (row.status, row.attempts, row.error["code"]) == ("queued", 2, "merge_timeout")
    shown = env.call(key, "GET", model).json()
    assert (shown["status"], shown["error"]) == ("queued", None)
    env.work(now=t + 122, settings=fast)
    failed = env.call(key, "GET", model).json()
    assert (failed["status"], failed["error"]["code"]) == ("failed", "merge_attempts_exhausted")
    assert env.row(account_id, model).attempts == 3


def test_other_accounts_get_404_and_no_key_gets_401(api, env, account, adapters):
    _, account_id, key = account
    model = env.register(account_id, adapters["good"])
    assert env.call(key, "POST", model).json()["status"] == "queued"
    _, other = api.create_account()
    for method, path in (("POST", ""), ("GET", ""), ("DELETE", ""), ("GET", "/files/config.json")):
        assert _error(env.call(other, method, model, path), 404)["code"] == "not_found"
        assert _error(env.call(None, method, model, path), 401)["code"] == "missing_api_key"
    with pytest.raises(openai.NotFoundError):
        api.client(other).post(f"/gridline/adapters/{model}/merged", cast_to=object)
    assert env.call(key, "GET", model).json()["status"] == "queued"
    assert env.call(key, "DELETE", model).json()["deleted"] is True


def test_deleting_a_model_hides_it_everywhere_and_deletes_its_adapter_and_exports(api, env, account, adapters):
    client, account_id, key = account
    model = env.register(account_id, adapters["good"])
    prefix = env.adapter_prefix(model)
    assert env.call(key, "POST", model).json()["status"] == "queued"
    assert env.work()
    export = env.row(account_id, model)
    assert export.status == "succeeded" and list(env.state.store.list(export.export_prefix + "/"))
    assert model in [m.id for m in client.models.list()] and client.models.retrieve(model).id == model
    with pytest.raises(openai.BadRequestError) as refused:
        client.models.delete(BASE.id)
    assert (refused.value.code, refused.value.param) == ("invalid_request", "model")
    assert BASE.id in [m.id for m in client.models.list()]

    deleted = client.models.delete(model)
    assert (deleted.id, deleted.object, deleted.deleted) == (model, "model", True)
    assert model not in [m.id for m in client.models.list()]
    for call in (lambda: client.models.retrieve(model), lambda: client.models.delete(model)):
        with pytest.raises(openai.NotFoundError):
            call()
    adapter_url = f"{api.base_url}/gridline/adapters/{model}/files/{ADAPTER_MODEL}"
    assert _error(httpx.get(adapter_url, headers={"authorization": f"Bearer {key}"}), 404)["code"] == "not_found"
    assert _error(env.call(key, "POST", model), 404)["code"] == "not_found"
    assert list(env.state.store.list(prefix + "/")) == []
    with env.state.db.session() as s:
        assert s.get(FineTunedModel, model).delete_error is None
        gone = s.get(Merge, export.id)
        assert gone.deleted_at is not None and gone.purged_at is not None
    assert list(env.state.store.list(export.export_prefix + "/")) == []  # the export went with the model


def test_a_storage_failure_on_model_delete_is_recorded_and_the_model_stays_unreachable(api, env, account, adapters):
    # The adapter file made immutable (chattr +i): the file system refuses the unlink, even to root.
    client, account_id, key = account
    model = env.register(account_id, adapters["good"])
    stuck = env.state.store.local_path(f"{env.adapter_prefix(model)}/{ADAPTER_MODEL}")
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        assert client.models.delete(model).deleted is True
        assert stuck.exists()  # the failure was real
        with env.state.db.session() as s:
            assert s.get(FineTunedModel, model).delete_error == "PermissionError"
        assert model not in [m.id for m in client.models.list()]
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(model)
        download = httpx.get(f"{api.base_url}/gridline/adapters/{model}/files/{ADAPTER_MODEL}",
                             headers={"authorization": f"Bearer {key}"})  # fmt: skip
        assert _error(download, 404)["code"] == "not_found"
        assert _error(env.call(key, "POST", model), 404)["code"] == "not_found"
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
