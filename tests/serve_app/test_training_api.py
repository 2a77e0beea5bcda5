"""End to end through the SDK with the real job controller: queued jobs train on Ray Train
(stand-in bases, CPU workers), register their adapters and answer the reference's statuses."""

from __future__ import annotations

import hashlib
import io
import tempfile
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from catalog.bases import get_base
from catalog.model_source import load_model, load_tokenizer, parse_model_source
from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from tests.factories import preference_row

ENDED = ("succeeded", "failed", "cancelled")
SFT = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
    "n_epochs": 5, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 16, "lora_alpha": 32}}}


def wait(client, job_id: str, statuses=ENDED, timeout: float = 400):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in statuses:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {job.status} after {timeout} s")


def events(client, job_id: str) -> list:
    return list(reversed(list(client.fine_tuning.jobs.list_events(job_id, limit=100))))


@pytest.fixture(scope="module")
def trainer_account(training_api, controller):
    _, key = training_api.create_account(open_jobs=3)
    return training_api.client(key), key


@pytest.fixture(scope="module")
def sft_job(trainer_account):
    """One real SFT LoRA job on the ticket task, shared by the tests that read its results."""
    client, _ = trainer_account
    train_rows, _ = ticket_splits()
    upload = client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(train_rows))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=upload.id, method=SFT, seed=0)
    return wait(client, job.id)


def _answer(model, tokenizer, ticket: str) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}], tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return (tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).split() or [""])[0]


def test_sft_job_succeeds_registers_and_learns(sft_job, trainer_account, training_api):
    client, key = trainer_account
    job = sft_job
    assert job.status == "succeeded", job.error
    gl = job.model_extra["gridline"]
    result = gl["result"]
    assert result["eval_loss"] < result["eval_loss_before"]
    assert result["eval_source"] == "holdout" and result["eval_rows"] == 10
    assert result["loss_mask"]["every_trained_turn_ends_with_eot"] is True
    assert job.trained_tokens == result["trained_tokens"] > 0
    org = client.fine_tuning.jobs.retrieve(job.id).organization_id.removeprefix("org-")
    assert job.fine_tuned_model == f"ft:qwen2.5-0.5b-instruct:{org}:{job.id.removeprefix('ftjob-')[:12]}"
    adapter = gl["fine_tuned_adapter"]
    assert (adapter["model"], adapter["servable"], adapter["reason"]) == (job.fine_tuned_model, True, None)
    # The serving-parity check (train/parity.py) ran before registration, on held-out rows only.
    parity = adapter["parity"]
    assert (parity["passed"], parity["check"], parity["held_out_from"]) == (True, None, "holdout")
    assert parity["prompts"] == training_api.settings.parity_prompts and parity["eot_ok"] is True
    assert parity["eot_completions"] == parity["completions"] == 3 * parity["prompts"]
    for path in ("served", "merged"):
        assert parity["paths"][path]["agree"] is True
        assert parity["paths"][path]["tokens_compared"] >= 2 * parity["prompts"]  # a label and the end of turn
    assert parity["max_logit_gap"] <= parity["logit_tolerance"] and parity["seconds"] > 0
    kinds = [(e.type, (e.data or {}).get("step")) for e in events(client, job.id)]
    assert ("metrics", None) in kinds or any(t == "metrics" for t, _ in kinds)
    csv = client.files.content(job.result_files[0]).content.decode()
    assert csv.splitlines()[0] == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"

    adapter_dir = Path(tempfile.mkdtemp())
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        r = httpx.get(f"{training_api.base_url}/gridline/adapters/{job.fine_tuned_model}/files/{name}",
                      headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        assert r.headers["x-gridline-sha256"] == hashlib.sha256(r.content).hexdigest()
        (adapter_dir / name).write_bytes(r.content)

    from peft import PeftModel

    base = get_base("qwen2.5-0.5b-instruct")
    source, cache = parse_model_source("standin"), training_api.settings.model_cache_dir
    tokenizer = load_tokenizer(base, source, cache)
    plain = load_model(base, source, cache).eval()
    tuned = PeftModel.from_pretrained(load_model(base, source, cache), adapter_dir).eval()
    _, held_out = ticket_splits()
    base_right = sum(_answer(plain, tokenizer, t) == label for t, label in held_out)
    tuned_right = sum(_answer(tuned, tokenizer, t) == label for t, label in held_out)
    assert tuned_right >= 0.9 * len(held_out), tuned_right
    assert base_right <= 0.1 * len(held_out), base_right


def test_models_api_lists_downloads_and_deletes(sft_job, trainer_account, training_api):
    client, key = trainer_account
    name = sft_job.fine_tuned_model
    ids = [m.id for m in client.models.list()]
    assert name in ids and "qwen2.5-7b-instruct" in ids
    assert client.models.retrieve(name).owned_by.startswith("org-")
    _, other_key = training_api.create_account()
    other = training_api.client(other_key)
    assert name not in [m.id for m in other.models.list()]
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve(name)
    with pytest.raises(openai.NotFoundError):
        other.models.delete(name)
    r = httpx.get(f"{training_api.base_url}/gridline/adapters/{name}/files/adapter_config.json",
                  headers={"Authorization": f"Bearer {other_key}"})
    assert r.status_code == 404


def _download(base_url: str, key: str, model: str, name: str) -> httpx.Response:
    return httpx.get(f"{base_url}/gridline/adapters/{model}/files/{name}", headers={"Authorization": f"Bearer {key}"})


def test_the_jobs_kept_checkpoints_are_models_to_retrieve_download_and_load(sft_job, trainer_account, training_api):
    """Issue 13: each checkpoint the job lists (the 3 newest epochs) is a model: retrieved through the
    SDK, its peft files downloaded with their SHA-256, loaded with peft, and resolved for a batch."""
    from peft import PeftModel
    from safetensors.torch import load as load_safetensors

    from jobs.model_names import resolve_model
    from storage.db import Database
    from storage.objects import open_object_store

    client, key = trainer_account
    job, url = sft_job, training_api.base_url
    per_epoch = job.model_extra["gridline"]["result"]["steps"] // 5
    listed = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in listed] == [per_epoch * e for e in (5, 4, 3)]
    names = [c.fine_tuned_model_checkpoint for c in listed]
    assert names == [f"{job.fine_tuned_model}:ckpt-step-{c.step_number}" for c in listed]
    files: dict[str, dict[str, bytes]] = {}
    for ckpt, name in zip(listed, names):
        model = client.models.retrieve(name)
        assert (model.id, model.owned_by, model.created) == (name, job.organization_id, ckpt.created_at)
        assert model.model_extra["gridline"]["step"] == ckpt.step_number
        files[name] = {}
        for file in ("adapter_model.safetensors", "adapter_config.json"):
            r = _download(url, key, name, file)
            assert r.status_code == 200
            assert r.headers["x-gridline-sha256"] == hashlib.sha256(r.content).hexdigest()
            files[name][file] = r.content
    final = {f: _download(url, key, job.fine_tuned_model, f).content for f in files[names[0]]}
    assert files[names[0]] == final  # the last epoch's checkpoint is the trained adapter
    assert files[names[2]]["adapter_model.safetensors"] != final["adapter_model.safetensors"]
    assert name not in [m.id for m in client.models.list()]

    # Resolved for a batch: a checkpoint, its prefix holding exactly the downloaded files.
    settings = training_api.settings
    db = Database(settings.resolved_database_url())
    try:
        with db.session() as session:
            resolved = resolve_model(session, _account_id(session, job.id), names[2])
    finally:
        db.dispose()
    assert (resolved.kind, resolved.base_id, resolved.servable) == ("checkpoint", job.model, True)
    store = open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                              s3_region=settings.s3_region)
    assert {f: store.get_bytes(resolved.adapter_prefix + f) for f in files[names[2]]} == files[names[2]]

    # The oldest kept checkpoint (epoch 3 of 5) loads with peft (its weights, exactly) and already answers
    # most held-out rows (29 of 40 here, seed 0), where the base answers at most 10 %.
    adapter_dir = Path(tempfile.mkdtemp())
    for file, data in files[names[2]].items():
        (adapter_dir / file).write_bytes(data)
    base = get_base(job.model)
    source, cache = parse_model_source("standin"), settings.model_cache_dir
    tuned = PeftModel.from_pretrained(load_model(base, source, cache), adapter_dir).eval()
    loaded = {k.replace(".default", ""): v for k, v in tuned.state_dict().items() if "lora_" in k}
    weights = load_safetensors(files[names[2]]["adapter_model.safetensors"])
    assert set(loaded) == set(weights) and all(bool((loaded[k] == v).all()) for k, v in weights.items())
    tokenizer = load_tokenizer(base, source, cache)
    _, held_out = ticket_splits()
    right = sum(_answer(tuned, tokenizer, t) == label for t, label in held_out)
    assert right >= 0.6 * len(held_out), right

    # Not found: a rotated-out epoch, an unknown step, another account.
    _, other_key = training_api.create_account()
    other = training_api.client(other_key)
    for who, who_key, name in [(client, key, f"{job.fine_tuned_model}:ckpt-step-{per_epoch}"),
                               (client, key, f"{job.fine_tuned_model}:ckpt-step-{per_epoch * 5 + 1}"),
                               (other, other_key, names[0])]:
        with pytest.raises(openai.NotFoundError) as info:
            who.models.retrieve(name)
        assert (info.value.body["code"], info.value.body["param"]) == ("not_found", "model")
        r = _download(url, who_key, name, "adapter_config.json")
        assert (r.status_code, r.json()["error"]["param"]) == (404, "model")


def _account_id(session, job_id: str) -> str:
    from storage.models import Job

    return session.get(Job, job_id).account_id


@pytest.mark.heavy  # a Ray Train run of its own (make test-heavy)
def test_dpo_job_succeeds_with_eval_loss_from_ln2(trainer_account):
    client, _ = trainer_account
    rows = [preference_row(f"question {i}?", f"good answer {i}", f"bad reply {i}") for i in range(40)]
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    upload = client.files.create(file=("prefs.jsonl", io.BytesIO(data)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="qwen2.5-0.5b-instruct", training_file=upload.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1, "n_epochs": 2, "learning_rate": 5e-3}}},
    )
    job = wait(client, job.id)
    assert job.status == "succeeded", job.error
    result = job.model_extra["gridline"]["result"]
    assert abs(result["eval_loss_before"] - 0.6931) < 1e-3
    assert result["eval_loss"] < result["eval_loss_before"]


def test_context_too_long_fails_before_training(trainer_account):
    client, _ = trainer_account
    long_rows = [{"messages": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]}] * 12
    data = b"".join(orjson.dumps(r) + b"\n" for r in long_rows)
    upload = client.files.create(file=("long.jsonl", io.BytesIO(data)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model="qwen2.5-0.5b-instruct", training_file=upload.id, hyperparameters={"max_seq_length": 128},
    )
    job = wait(client, job.id)
    assert job.status == "failed" and job.error.code == "context_too_long"
    last = events(client, job.id)[-1]
    assert last.level == "error" and last.data["code"] == "context_too_long"
    assert job.fine_tuned_model is None


@pytest.mark.heavy  # a Ray Train run of its own (make test-heavy)
def test_job_on_a_batch_results_file_trains_on_its_distilled_rows(trainer_account):
    """The shortcut: a batch_output file as training_file is distilled with the defaults first, by
    the controller, while the job waits in validating_files (tests/serve_app/test_distill_jobs.py
    has its failures, cancel and restart)."""
    from tests.factories import distill_files

    client, _ = trainer_account
    results, requests, _ = distill_files("openai", 300, seed=5)
    req = client.files.create(file=("in.jsonl", io.BytesIO(requests)), purpose="batch")
    res = client.files.create(file=("out.jsonl", io.BytesIO(results)), purpose="batch_output")
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=res.id,
                                         hyperparameters={"max_seq_length": 512})
    assert (job.status, job.training_file, job.model_extra["gridline"]["reason"]) == (
        "validating_files", res.id, "distilling")
    job = wait(client, job.id)
    assert job.status == "succeeded", job.error
    derived = job.model_extra["gridline"]["derived_from"]
    assert (derived["results_file"], derived["requests_file"]) == (res.id, req.id)
    assert job.training_file == derived["training_file"] != res.id
    assert job.validation_file == derived["validation_file"]
    assert any((e.data or {}).get("derived_from") for e in events(client, job.id))
    distilled = client.files.retrieve(job.training_file).model_extra["gridline"]
    assert distilled["derived_from"]["results_file"] == res.id
    assert job.model_extra["gridline"]["result"]["eval_source"] == "validation_file"
