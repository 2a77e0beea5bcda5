"""The forwarder (train/integrations/forwarder.py) on a real SQLite database, fed the events a
run writes, logging with the real wandb library in offline mode; an MLflow server that does not
answer only warns. Seconds: no training, no Ray."""

from __future__ import annotations

import pytest

from jobs.integrations import parse_integrations
from jobs.spec import JobSpec
from openft.settings import Settings
from storage.db import Database
from storage.jobs import add_event
from storage.models import Job, JobEvent
from tests.conftest import free_port
from tests.factories import db_account, db_create_job, db_training_file
from tests.utils.wandb_log import finished_offline_run
from train.integrations.forwarder import Forwarder

STEPS = [{"step": 1, "total_steps": 3, "train_loss": 2.5, "learning_rate": 1e-3, "elapsed": 0.5},
         {"step": 2, "total_steps": 3, "train_loss": 2.0, "learning_rate": 5e-4, "elapsed": 1.0},
         {"step": 3, "total_steps": 3, "train_loss": 1.25, "valid_loss": 1.5, "learning_rate": 1e-4, "elapsed": 1.5}]


@pytest.fixture
def setup(tmp_path):
    settings = Settings(data_dir=tmp_path, wandb_mode="offline", mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}",
                        tracking_timeout_seconds=5, db_outage_seconds=2)
    db = Database(settings.resolved_database_url())
    account = db_account(db)
    job_id = db_create_job(db, account, db_training_file(db, account))
    integrations = parse_integrations([
        {"type": "wandb", "wandb": {"project": "proj", "name": "my run", "tags": ["mine"]}},
        {"type": "mlflow", "mlflow": {"experiment": "exp"}},
    ])
    with db.session() as session:
        job = session.get(Job, job_id)
        job.spec = {**job.spec, "integrations": list(integrations)}
        job.status = "running"
    return settings, db, job_id


def metrics(db, job_id, rows):
    with db.session() as session:
        for data in rows:
            add_event(session, job_id, 0, f"Step {data['step']}", type="metrics", data=data)


def test_metrics_events_reach_wandb_in_order_and_a_dead_mlflow_only_warns(setup):
    settings, db, job_id = setup
    forwarder = Forwarder(settings, job_id, db=db)
    metrics(db, job_id, STEPS[:2])
    with db.session() as session:  # a message event is not a metric
        add_event(session, job_id, 0, "Loss-mask report.", data={"rows": 4})
    assert forwarder.poll() is False  # still running
    metrics(db, job_id, STEPS[2:])
    with db.session() as session:
        job = session.get(Job, job_id)
        add_event(session, job_id, 0, "Training finished.", type="metrics",
                  data={"train_loss": 1.9, "eval_loss": 1.4, "steps": 3, "trained_tokens": 96, "eval_source": "x"})
        job.status, job.trained_tokens, job.fine_tuned_model = "succeeded", 96, "ft:m:org:abc"
        job.result = {"train_loss": 1.9, "eval_loss": 1.4, "steps": 3, "trained_tokens": 96, "eval_source": "x"}
    assert forwarder.poll() is True

    run = finished_offline_run(settings.resolved_wandb_dir(), job_id)
    assert (run.run_id, run.project, run.name) == (job_id, "proj", "my run")
    assert run.tags == ["mine", "openft/finetune", f"openft/{JobSpec.from_record(setup_spec(db, job_id)).model}",
                        f"openft/{job_id}"]
    assert [(h["_step"], h["train_loss"]) for h in run.history] == [(s["step"], s["train_loss"]) for s in STEPS]
    assert run.history[2]["valid_loss"] == 1.5 and run.history[0]["learning_rate"] == 1e-3
    assert run.config["learning_rate"] == 1e-3 and run.config["n_epochs"] == 1 and run.config["job_id"] == job_id
    assert run.summary["status"] == "succeeded" and run.summary["trained_tokens"] == 96
    assert run.summary["fine_tuned_model"] == "ft:m:org:abc" and run.summary["result/eval_loss"] == 1.4
    assert "result/eval_source" not in run.summary and run.exit_code == 0

    with db.session() as session:
        warns = [(e.level, e.message, e.data) for e in session.query(JobEvent).filter_by(job_id=job_id, level="warn")]
    assert len(warns) == 1, warns
    level, message, data = warns[0]
    assert data == {"code": "integration_failed", "integration": "mlflow", "stage": "start", "error": "ConnectError"}
    assert "exp" not in message and "127.0.0.1" not in message


def setup_spec(db, job_id):
    with db.session() as session:
        return session.get(Job, job_id).spec


def test_a_cancelled_job_ends_its_run_failed_and_a_gone_job_ends_the_forwarder(setup):
    settings, db, job_id = setup
    metrics(db, job_id, STEPS[:1])
    with db.session() as session:
        session.get(Job, job_id).status = "cancelled"
    Forwarder(settings, job_id, db=db).run()  # returns: the job has ended
    run = finished_offline_run(settings.resolved_wandb_dir(), job_id)
    assert run.summary["status"] == "cancelled" and run.exit_code == 1 and len(run.history) == 1
    assert Forwarder(settings, "ftjob-" + "0" * 32, db=db).poll() is True
