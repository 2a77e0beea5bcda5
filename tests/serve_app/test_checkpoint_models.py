"""Checkpoints are models (issue 13, item 5), through the Models and checkpoints services on a real
SQLite file and a real local store, with checkpoints written by the trainer's own `save_checkpoint`
and pruned by its `prune_checkpoints`: retrieve, download (digests from meta.json), the job's list,
and every 404: unknown step, another account's job, rotated out, files gone, model deleted, run reaped.
A real training run that ends in downloadable checkpoints is in tests/serve_app/test_training_api.py."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from openft.errors import InvalidRequest, NotFound
from openft.settings import Settings
from serve_app.services import fine_tuning_jobs, models
from serve_app.services.retention import reap_once
from serve_app.state import AppState
from storage import keys
from storage.models import Account, FineTunedModel, Job
from tests.factories import db_account, db_job_with_checkpoints
from train.checkpoint import prune_checkpoints, save_checkpoint

STEPS = [10, 20, 30, 40]  # 10 and its files are rotated out; 20, 30, 40 kept


@pytest.fixture
def state(tmp_path: Path) -> AppState:
    state = AppState.from_settings(Settings(data_dir=tmp_path / "d"))
    yield state
    state.db.dispose()


def adapter(step: int) -> dict[str, bytes]:
    return {"adapter_model.safetensors": f"weights of step {step}".encode() * 50,
            "adapter_config.json": b'{"peft_type": "LORA", "r": 8}\n'}


def account_of(state: AppState, account_id: str) -> Account:
    with state.db.session() as session:
        return session.get(Account, account_id)


@pytest.fixture
def trained(state: AppState):
    """An account, and its succeeded job with 4 checkpoints saved as the loop saves them."""
    owner = db_account(state.db)
    job_id, name = db_job_with_checkpoints(state.db, owner, STEPS)
    for step in STEPS:
        save_checkpoint(state.store, keys.checkpoints(job_id), step, adapter(step), {}, {"epoch": 1, "batch": 0})
        prune_checkpoints(state.store, keys.checkpoints(job_id))
    return account_of(state, owner), job_id, name


def download(state: AppState, account: Account, model: str, name: str) -> tuple[str, int, bytes]:
    sha256, size, chunks = models.adapter_file(state, account, model, name)
    return sha256, size, b"".join(chunks)


def not_found(call) -> None:
    with pytest.raises(NotFound) as info:
        call()
    assert (info.value.status, info.value.code, info.value.param) == (404, "not_found", "model")


def test_kept_checkpoints_are_models_listed_retrieved_and_downloaded(state, trained):
    account, job_id, name = trained
    listed = fine_tuning_jobs.list_checkpoints(state, account, job_id, limit=10, after=None).data
    assert [(c.step_number, c.fine_tuned_model_checkpoint) for c in listed] == [
        (s, f"{name}:ckpt-step-{s}") for s in (40, 30, 20)]
    for ckpt in listed:
        model = models.retrieve_model(state, account, ckpt.fine_tuned_model_checkpoint)
        assert (model.id, model.object, model.owned_by, model.created) == (
            ckpt.fine_tuned_model_checkpoint, "model", account.org_id, ckpt.created_at)
        assert model.gridline == {"base": "qwen2.5-0.5b-instruct", "job": job_id, "step": ckpt.step_number,
                                  "servable": True, "reason": None}
        for file, data in adapter(ckpt.step_number).items():
            assert download(state, account, model.id, file) == (hashlib.sha256(data).hexdigest(), len(data), data)
    # The trainer kept the three adapters and the newest optimizer state only.
    stored = sorted(k.removeprefix(keys.checkpoints(job_id)) for k in state.store.list(keys.checkpoints(job_id)))
    assert stored == sorted([f"step-{s:08d}/{f}" for s in (20, 30, 40) for f in ("adapter_config.json",
                             "adapter_model.safetensors", "meta.json")] + ["step-00000040/state.pt"])
    # Checkpoints are not in GET /v1/models (see serve_app/services/models.py), their ft: model is.
    assert [m.id for m in models.list_models(state, account).data if m.id.startswith("ft:")] == [name]


def test_unknown_other_accounts_and_rotated_out_checkpoints_are_not_found(state, trained):
    account, job_id, name = trained
    other = account_of(state, db_account(state.db))
    for who, model in [(account, f"{name}:ckpt-step-10"), (account, f"{name}:ckpt-step-25"),
                       (account, f"{name}:ckpt-step-0"), (other, f"{name}:ckpt-step-40")]:
        not_found(lambda: models.retrieve_model(state, who, model))
        not_found(lambda: models.adapter_file(state, who, model, "adapter_config.json"))
    with pytest.raises(NotFound) as info:  # the file name is the path's to get wrong
        models.adapter_file(state, account, f"{name}:ckpt-step-40", "state.pt")
    assert info.value.param == "path"


def test_a_checkpoint_whose_files_are_gone_is_not_found(state, trained):
    account, job_id, name = trained
    state.store.delete_prefix(keys.checkpoint(job_id, 30))
    not_found(lambda: models.retrieve_model(state, account, f"{name}:ckpt-step-30"))
    not_found(lambda: models.adapter_file(state, account, f"{name}:ckpt-step-30", "adapter_model.safetensors"))
    assert models.retrieve_model(state, account, f"{name}:ckpt-step-40").id == f"{name}:ckpt-step-40"


def test_deleting_the_model_deletes_its_checkpoints_and_a_checkpoint_is_not_deleted_alone(state, trained):
    account, job_id, name = trained
    with pytest.raises(InvalidRequest) as info:
        models.delete_model(state, account, f"{name}:ckpt-step-40")
    assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_request", "model")
    assert len(list(state.store.list(keys.checkpoints(job_id)))) == 10  # nothing deleted
    assert models.delete_model(state, account, name).deleted is True
    for step in (20, 30, 40):
        not_found(lambda: models.retrieve_model(state, account, f"{name}:ckpt-step-{step}"))
        not_found(lambda: models.adapter_file(state, account, f"{name}:ckpt-step-{step}", "adapter_config.json"))
    assert list(state.store.list(keys.checkpoints(job_id))) == []
    assert fine_tuning_jobs.list_checkpoints(state, account, job_id, limit=10, after=None).data == []


def test_checkpoints_go_with_the_runs_copies_and_the_model_stays(state, trained, monkeypatch):
    account, job_id, name = trained
    finished = int(time.time()) - 3600
    with state.db.session() as session:
        session.get(Job, job_id).finished_at = finished
        row = session.get(FineTunedModel, name)
        row.adapter_prefix = keys.adapter(job_id).rstrip("/")
        row.files = {f: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for f, d in adapter(40).items()}
    for file, data in adapter(40).items():
        state.store.put_bytes(keys.adapter(job_id) + file, data)
    reap_once(state, now=finished + 6 * 86400)
    assert models.retrieve_model(state, account, f"{name}:ckpt-step-40")  # within the 7 days
    reap_once(state, now=finished + 8 * 86400)
    not_found(lambda: models.retrieve_model(state, account, f"{name}:ckpt-step-40"))
    not_found(lambda: models.adapter_file(state, account, f"{name}:ckpt-step-40", "adapter_config.json"))
    assert list(state.store.list(keys.checkpoints(job_id))) == []
    assert fine_tuning_jobs.list_checkpoints(state, account, job_id, limit=10, after=None).data == []
    assert download(state, account, name, "adapter_config.json")[2] == adapter(40)["adapter_config.json"]


def test_a_download_only_bases_checkpoint_is_a_model_that_is_not_servable(state):
    owner = account_of(state, db_account(state.db))
    job_id, name = db_job_with_checkpoints(state.db, owner.id, [5], model="gpt-oss-20b")
    save_checkpoint(state.store, keys.checkpoints(job_id), 5, adapter(5), {}, {"epoch": 1, "batch": 0})
    model = models.retrieve_model(state, owner, f"{name}:ckpt-step-5")
    assert (model.gridline["servable"], model.gridline["base"]) == (False, "gpt-oss-20b")
    assert "download the adapter" in model.gridline["reason"]
    assert download(state, owner, model.id, "adapter_config.json")[2] == adapter(5)["adapter_config.json"]
