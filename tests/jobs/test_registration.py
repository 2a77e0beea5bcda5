"""Registration says where the user looks when a model is not servable: a warning event in the
job's log, written in register()'s transaction, with advice matching the cause; and the job keeps
fine_tuned_model null while gridline.fine_tuned_adapter names the downloadable adapter."""

from __future__ import annotations

import time

import orjson
import pytest
from sqlalchemy import select

from openft.settings import Settings
from storage.db import Database
from storage.models import Job, JobEvent
from storage.objects import open_object_store
from tests.factories import db_account, db_create_job, db_training_file
from jobs.registration import NOT_SERVABLE_ADVICE, register
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
