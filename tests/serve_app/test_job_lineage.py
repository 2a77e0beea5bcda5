"""Jobs that continue from an ft: model or a kept checkpoint (issue 26 item 2), through the official
SDK on SQLite and PostgreSQL: the parent fixes the base, the rank and the alpha, the job records it
in `gridline.parent` and starts from a copy of its adapter; another account's model, an unknown one
and a rank or alpha change are refused and create nothing. The SFT -> SFT chain that proves the
child starts from the parent's weights trains on the training deployment (tests/serve_app/test_rft_chain.py)."""

from __future__ import annotations

import io

import openai
import pytest

from catalog.bases import get_base
from openft.demo_data import ticket_splits, tickets_jsonl
from storage import keys
from storage.context import open_store
from storage.db import Database
from tests.factories import db_job_with_checkpoints, random_adapter

TRAIN = tickets_jsonl(ticket_splits()[0][:24])
BASE = "qwen2.5-0.5b-instruct"


def _job_ids(client) -> list[str]:
    return [j.id for j in client.fine_tuning.jobs.list(limit=100).data]


def _refused(client, status: int, **create) -> dict:
    before = _job_ids(client)
    with pytest.raises(openai.APIStatusError) as info:
        client.fine_tuning.jobs.create(**create)
    assert info.value.status_code == status
    assert _job_ids(client) == before
    return info.value.body


@pytest.fixture(scope="module")
def parent(api):
    """An account with a registered ft: model (rank 8, alpha 16, trained by a recorded job with
    checkpoints at steps 3 and 6) whose adapter files are real peft files in the store, and a
    training file; another account with a training file of its own."""
    db = Database(api.settings.resolved_database_url())
    store = open_store(api.settings)
    account_id, key = api.create_account(open_jobs=5)
    job_id, name = db_job_with_checkpoints(db, account_id, [3, 6])
    adapter = random_adapter(get_base(BASE), api.settings.model_cache_dir, seed=1, rank=8)
    checkpoint = random_adapter(get_base(BASE), api.settings.model_cache_dir, seed=2, rank=8)
    for file, data in adapter.items():
        store.put_bytes(f"runs/{job_id}/adapter/{file}", data)
    for file, data in checkpoint.items():
        store.put_bytes(keys.checkpoint(job_id, 6) + file, data)
    db.dispose()
    client = api.client(key)
    training = client.files.create(file=("t.jsonl", io.BytesIO(TRAIN)), purpose="fine-tune").id
    _, other_key = api.create_account(open_jobs=5)
    other = api.client(other_key)
    other_training = other.files.create(file=("t.jsonl", io.BytesIO(TRAIN)), purpose="fine-tune").id
    return {"client": client, "name": name, "job": job_id, "training": training, "store": store,
            "adapter": adapter, "checkpoint": checkpoint, "other": other, "other_training": other_training}


def test_a_job_continues_from_an_ft_model_and_from_a_checkpoint(parent):
    client, store = parent["client"], parent["store"]
    for model, files in ((parent["name"], parent["adapter"]), (f"{parent['name']}:ckpt-step-6", parent["checkpoint"])):
        job = client.fine_tuning.jobs.create(model=model, training_file=parent["training"], seed=3)
        try:
            assert job.model == BASE  # the job's model is its base; the parent is in gridline
            assert job.model_extra["gridline"]["parent"] == {
                "model": model, "fine_tuning_job_id": parent["job"], "lora_rank": 8, "lora_alpha": 16}
            assert (job.hyperparameters.model_extra["lora_rank"], job.hyperparameters.model_extra["lora_alpha"]) == (8, 16)
            assert client.fine_tuning.jobs.retrieve(job.id).model_extra["gridline"]["parent"]["model"] == model
            for file, data in files.items():  # the run starts from this copy
                assert store.get_bytes(keys.parent_adapter(job.id) + file) == data
        finally:
            client.fine_tuning.jobs.cancel(job.id)


def test_the_parents_rank_and_alpha_may_be_repeated(parent):
    client = parent["client"]
    job = client.fine_tuning.jobs.create(
        model=parent["name"], training_file=parent["training"],
        method={"type": "supervised", "supervised": {"hyperparameters": {"lora_rank": 8, "lora_alpha": 16}}})
    client.fine_tuning.jobs.cancel(job.id)
    assert job.model_extra["gridline"]["parent"]["lora_rank"] == 8


@pytest.mark.parametrize("hyperparameters, param, named", [
    ({"lora_rank": 16}, "hyperparameters.lora_rank", "lora_rank 8"),
    ({"lora_alpha": 32}, "hyperparameters.lora_alpha", "lora_alpha 16"),
])
def test_a_rank_or_alpha_change_on_a_parent_is_refused(parent, hyperparameters, param, named):
    body = _refused(parent["client"], 400, model=parent["name"], training_file=parent["training"],
                    hyperparameters=hyperparameters)
    assert (body["code"], body["param"]) == ("invalid_value", param)
    assert named in body["message"]  # the parent's value, by name


def test_a_dpo_job_on_a_parent_refuses_a_rank_change_under_its_method(parent):
    body = _refused(parent["client"], 400, model=parent["name"], training_file=parent["training"],
                    method={"type": "dpo", "dpo": {"hyperparameters": {"lora_rank": 4}}})
    assert (body["code"], body["param"]) == ("invalid_value", "method.dpo.hyperparameters.lora_rank")


def test_another_accounts_model_an_unknown_one_and_a_pruned_checkpoint_answer_404(parent):
    other = parent["other"]
    for model in (parent["name"], f"{parent['name']}:ckpt-step-6"):
        body = _refused(other, 404, model=model, training_file=parent["other_training"])
        assert (body["code"], body["param"]) == ("model_not_found", "model")
    client = parent["client"]
    for model in (parent["name"] + "0", f"{parent['name']}:ckpt-step-5", "ft:nothing-here"):
        body = _refused(client, 404, model=model, training_file=parent["training"])
        assert (body["code"], body["param"]) == ("model_not_found", "model")
