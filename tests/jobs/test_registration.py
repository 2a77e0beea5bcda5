"""Registration says where the user looks when a model is not servable: a warning event in the
job's log, written in register()'s transaction, with advice matching the cause; and the job keeps
fine_tuned_model null while gridline.fine_tuned_adapter names the downloadable adapter. The
results CSV of a reinforcement job carries its reward figures by step."""

from __future__ import annotations

import time

import orjson
import pytest
from sqlalchemy import select

from openft.settings import Settings
from storage.db import Database
from storage.jobs import add_event
from storage.models import Job, JobEvent
from storage.objects import open_object_store
from tests.factories import db_account, db_create_job, db_training_file
from jobs.registration import NOT_SERVABLE_ADVICE, RESULTS_COLUMNS, register, results_csv, results_rows
from train.parity import decide


@pytest.fixture
def env(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'openft.db'}")
    store = open_object_store(f"file://{tmp_path / 'objects'}")
    yield db, store, Settings(data_dir=tmp_path)
    db.dispose()


def _register(db, store, settings, parity):
    account = db_account(db)
    job_id = db_create_job(db, account, db_training_file(db, account))
    prefix = f"runs/{job_id}/adapter"
    store.put_bytes(f"{prefix}/adapter_config.json", orjson.dumps({"peft_type": "LORA", "r": 8}))
    store.put_bytes(f"{prefix}/adapter_model.safetensors", b"\0" * 64)
    with db.session() as session:
        job = session.get(Job, job_id)
        register(session, store, job, method_type="supervised", adapter_prefix=prefix, now=int(time.time()),
                 metrics_rows=[], settings=settings, parity=parity)
    with db.session() as session:
        job = session.get(Job, job_id)
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)).all()
        return job.fine_tuned_model, dict(job.fine_tuned_adapter), [(e.level, e.message, e.data) for e in events]


def test_a_model_that_does_not_end_its_turns_is_said_with_what_to_do(env):
    code, reason = decide({}, [True, False, False], 0.05, "<|im_end|>", [40, 40, 40])
    model, adapter, events = _register(*env, {"servable": False, "reason": reason, "parity": {"check": code}})
    assert model is None and adapter["servable"] is False and adapter["model"].startswith("ft:")
    level, message, data = events[-1]
    assert (level, data) == ("warn", {"servable": False, "code": "parity_end_of_turn"})
    assert reason in message and NOT_SERVABLE_ADVICE["parity_end_of_turn"] in message
    assert "more epochs" in message and "learning_rate_multiplier" in message
    assert "rows whose assistant turns end" not in message  # the old advice blamed the data


def test_a_servable_model_gets_no_warning(env):
    model, adapter, events = _register(*env, {"servable": True, "reason": None, "parity": {"check": None}})
    assert model == adapter["model"] and not [e for e in events if e[0] == "warn"]


def test_a_check_that_could_not_run_says_run_again(env):
    from train.parity import parity_error

    model, _, events = _register(*env, parity_error("TimeoutError", 900.0))
    assert model is None and NOT_SERVABLE_ADVICE["parity_check_error"] in events[-1][1]


def test_a_reinforcement_jobs_results_have_its_reward_columns(env):
    db, _, _ = env
    account = db_account(db)
    rft_job, sft_job = (db_create_job(db, account, db_training_file(db, account)) for _ in range(2))
    now = int(time.time())
    with db.session() as session:
        for step, (mean, graders) in enumerate([(0.25, {"label": 0.5, "len": 0.0}), (0.75, {"label": 1.0, "len": 0.5})], 1):
            add_event(session, rft_job, now, "metrics", type="metrics", data={
                "step": step, "total_steps": 2, "train_loss": -0.1 * step, "reward_mean": mean, "reward_std": 0.4,
                "kl": 0.01 * step, "completion_length": 5.0, "zero_variance_groups": 0.5, "grader_failures": 0,
                "grader_rewards": graders})  # fmt: skip
            if step == 2:  # the validation reward is recorded on the checkpoint of its step
                add_event(session, rft_job, now, "Checkpoint saved at step 2.",
                          data={"checkpoint": {"step": 2, "epoch": 0, "train_loss": -0.15, "valid_reward": 0.8}})
        add_event(session, sft_job, now, "metrics", type="metrics", data={"step": 1, "train_loss": 2.5, "train_accuracy": 0.1})
    with db.session() as session:
        rft_csv = results_csv(results_rows(session, rft_job)).decode().splitlines()
        sft_csv = results_csv(results_rows(session, sft_job)).decode().splitlines()
    assert rft_csv == [
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,train_mean_reward,train_reward_std,kl,"
        "completion_length,zero_variance_groups,grader_failures,train_reward:label,train_reward:len,valid_mean_reward",
        "1,-0.1,,,,0.25,0.4,0.01,5.0,0.5,0,0.5,0.0,",
        "2,-0.2,,,,0.75,0.4,0.02,5.0,0.5,0,1.0,0.5,0.8",
    ]
    assert sft_csv == [",".join(RESULTS_COLUMNS), "1,2.5,0.1,,"]
