"""The job controller's control paths through the API (the reference's "The job" and "Errors").

Real runs on the training deployment's controller actor (stand-in base, CPU Ray Train worker):
cancel and pause stop a running Train run between steps; resume continues from the pause
checkpoint to an adapter; a registration refused by the model quota fails the job
`adapter_quota_exceeded`. Each run costs 20-45 s on two cores (Ray Train's start), so the file
runs four. The restart and expiry passes need no run: `Controller(settings)` in-process on a
data dir of the test's own, so the shared controller never sees those jobs.

`time_limit_exceeded` is not driven here: it would be a fifth run, and tests/train covers the
recipe's TrainingError; the controller turns every TrainingError into its code the same way.
"""

from __future__ import annotations

import io
import re
import time

import pytest
from sqlalchemy import select

from jobs.model_names import CHECKPOINTS_KEPT
from jobs.model_names import model_name
from openft.demo_data import ticket_splits, tickets_jsonl
from openft.settings import Settings
from storage.accounts import create_account, limits_row
from storage.db import Database
from storage.models import FineTunedModel, Job
from tests.serve_app.test_billing import put_job
from tests.serve_app.test_training_api import events, wait
from tests.utils.polling import until

MODEL = "qwen2.5-0.5b-instruct"


def new_client(api):
    _, key = api.create_account()
    return api.client(key)


def start_job(client, rows: list, *, n_epochs: int, batch_size: int = 1):
    upload = client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")
    method = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
        "n_epochs": n_epochs, "batch_size": batch_size, "learning_rate": 1e-3}}}
    return client.fine_tuning.jobs.create(model=MODEL, training_file=upload.id, method=method, seed=0)


def first_metrics(client, job_id: str):
    """Wait until the Train run reports its first steps (after tokenizing and Ray Train's start)."""
    def newest():
        page = client.fine_tuning.jobs.list_events(job_id, limit=20).data
        return next((e for e in page if e.type == "metrics"), None)

    return until(newest, "metrics event", 240)


def event_matching(client, job_id: str, pattern: str, timeout: float):
    def find():
        return next((e for e in events(client, job_id) if re.fullmatch(pattern, e.message)), None)

    return until(find, f"event matching {pattern!r}", timeout)


def run_stopped(controller, timeout: float = 60) -> None:
    import ray

    until(lambda: ray.get(controller.active_runs.remote()) == [], "end of the controller's run", timeout)


def in_db(api, read):
    db = Database(api.settings.resolved_database_url())
    try:
        with db.session() as session:
            return read(session)
    finally:
        db.dispose()


def model_rows(api, job_id: str) -> list:
    return in_db(api, lambda s: s.scalars(select(FineTunedModel.id).where(FineTunedModel.job_id == job_id)).all())


def expected_model(client, job) -> str:
    return model_name(MODEL, client.fine_tuning.jobs.retrieve(job.id).organization_id, job.id)


# -- real runs on the training deployment's controller ------------------------------------------
def test_cancel_stops_the_running_train_run_and_registers_nothing(training_api, controller):
    client = new_client(training_api)
    job = start_job(client, ticket_splits()[0], n_epochs=10)  # ~2,000 steps: far from done when cancelled
    first_metrics(client, job.id)

    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    stopped = event_matching(client, job.id, r"Training cancelled at step (\d+)\.", timeout=10)
    run_stopped(controller)

    settled = events(client, job.id)
    time.sleep(2)  # a run still stepping would report metrics every 10 steps
    assert [e.id for e in events(client, job.id)] == [e.id for e in settled]
    stop_step = int(stopped.message.split()[-1].rstrip("."))
    steps = [e.data["step"] for e in settled if e.type == "metrics"]
    assert steps and max(steps) <= stop_step < 2000
    assert "Fine-tuning job cancelled." in [e.message for e in settled]
    assert settled[-1].id == stopped.id  # the run's stop is the ended job's last word

    ended = client.fine_tuning.jobs.retrieve(job.id)
    assert (ended.status, ended.fine_tuned_model, ended.error) == ("cancelled", None, None)
    assert ended.model_extra["gridline"]["fine_tuned_adapter"] is None
    assert expected_model(client, job) not in [m.id for m in client.models.list()]
    assert model_rows(training_api, job.id) == []


def test_pause_checkpoints_and_stops_then_resume_trains_on_to_an_adapter(training_api, controller):
    client = new_client(training_api)
    rows = ticket_splits()[0][:60]  # 57 train rows after the 5 % holdout, batch 1: 57 steps an epoch
    job = start_job(client, rows, n_epochs=5)
    first_metrics(client, job.id)

    paused = client.fine_tuning.jobs.pause(job.id)
    assert (paused.status, paused.estimated_finish) == ("paused", None)
    saved = event_matching(client, job.id, r"Training paused at step \d+; checkpoint saved\.", timeout=10)
    step = saved.data["step"]
    assert 10 <= step < 285
    run_stopped(controller)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "paused"
    assert events(client, job.id)[-1].message == "Checkpoint saved; job paused."

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    newest = checkpoints[0]
    assert re.fullmatch(r"ftckpt_[0-9a-f]{24}", newest.id)
    assert (newest.object, newest.fine_tuning_job_id, newest.step_number, newest.metrics.step) == (
        "fine_tuning.job.checkpoint", job.id, step, step)
    assert newest.fine_tuned_model_checkpoint == f"{expected_model(client, job)}:ckpt-step-{step}"
    # Epoch-end checkpoints before the pause, newest first; every one at a whole epoch; the 3 newest are kept.
    # A pause that lands on an epoch's last step saves one checkpoint for both: each step is listed once.
    epochs_before = [57 * e for e in range(step // 57, 0, -1) if 57 * e != step]
    assert [c.step_number for c in checkpoints[1:]] == epochs_before[:CHECKPOINTS_KEPT - 1]

    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    done = wait(client, job.id)
    assert done.status == "succeeded", done.error
    said = events(client, job.id)
    resumed = next(e for e in said if e.message == f"Resumed from the checkpoint at step {step}.")
    assert (resumed.level, resumed.data["step"], resumed.data["checkpoint"]) == ("info", step, f"ckpt-step-{step}")
    listed = [c.step_number for c in client.fine_tuning.jobs.checkpoints.list(job.id, limit=100).data]
    # The resume event names its checkpoint but is not one: each step once, the kept newest only.
    assert listed == sorted({57 * e for e in range(1, 6)} | {step}, reverse=True)[:CHECKPOINTS_KEPT]
    result = done.model_extra["gridline"]["result"]
    assert (result["steps"], result["eval_rows"]) == (285, 3)  # the whole schedule, across both runs
    assert done.fine_tuned_model == expected_model(client, job)
    assert model_rows(training_api, job.id) == [done.fine_tuned_model]
    assert in_db(training_api, lambda s: s.get(Job, job.id).attempts) == 1  # a pause is not a lost run
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data[0].step_number == 285


@pytest.mark.heavy  # a Ray Train run of its own (make test-heavy)
def test_registration_over_the_model_quota_fails_adapter_quota_exceeded(training_api, controller):
    account_id, key = training_api.create_account()
    client = training_api.client(key)
    job = start_job(client, ticket_splits()[0][:20], n_epochs=1, batch_size=4)
    def lower_limit(session):  # an operator lowers the limit while the job trains
        limits_row(session, account_id).models = 0

    in_db(training_api, lower_limit)

    ended = wait(client, job.id)

    assert (ended.status, ended.error.code, ended.fine_tuned_model) == ("failed", "adapter_quota_exceeded", None)
    assert "limit 0" in ended.error.message
    result = ended.model_extra["gridline"]["result"]
    assert ended.trained_tokens == result["trained_tokens"] > 0
    assert result["steps"] == 5  # 19 rows after the holdout, batch 4
    last = events(client, job.id)[-1]
    assert (last.level, last.data) == ("error", {"code": "adapter_quota_exceeded"})
    assert model_rows(training_api, job.id) == []
    assert ended.result_files == []


# -- the controller's restart and expiry passes, in-process on a data dir of the test's own -------
@pytest.fixture
def own_db(tmp_path, ray_cluster):
    settings = Settings(data_dir=tmp_path / "d", model_source="standin", capacity_wait_limit_seconds=600)
    db = Database(settings.resolved_database_url())
    with db.session() as session:
        accounts = [create_account(session, f"ctl-{i}", open_jobs_limit=1)[0].id for i in range(3)]
    yield settings, db, accounts
    db.dispose()


def job_state(db: Database, job_id: str):
    from storage import jobs as jobs_repo

    with db.session() as session:
        job = session.get(Job, job_id)
        last = jobs_repo.list_events(session, job_id, limit=1, after=None)[0][0]
        return job.status, (job.error or {}).get("code"), last.level, last.message, last.data


def test_restarted_controller_requeues_a_lost_run_once_then_fails_it_platform_interrupted(own_db):
    from worker.controller import Controller

    settings, db, (first, second, _) = own_db
    lost_once = put_job(db, first, status="running", attempts=1)
    lost_twice = put_job(db, second, status="running", attempts=2)

    ctl = Controller(settings)  # its construction is the restart: it reconciles
    try:
        assert job_state(db, lost_once)[:3] == ("queued", None, "warn")
        assert job_state(db, lost_twice) == (
            "failed", "platform_interrupted", "error",
            "platform_interrupted: The worker running the job was lost and the job is not restarted.",
            {"code": "platform_interrupted"})
        assert ctl.reconcile() == []  # nothing left running that no run drives
    finally:
        ctl.db.dispose()


def test_tick_fails_a_job_queued_past_the_capacity_wait_limit_job_unavailable(own_db):
    from worker.controller import Controller

    settings, db, (stale_account, fresh_account, _) = own_db
    now = int(time.time())
    stale = put_job(db, stale_account, status="queued", created_at=now - 601)
    fresh = put_job(db, fresh_account, status="validating_files", created_at=now - 60)

    ctl = Controller(settings)
    try:
        assert ctl.tick() == []
    finally:
        ctl.db.dispose()

    status, code, level, _, data = job_state(db, stale)
    assert (status, code, level, data) == ("failed", "job_unavailable", "error", {"code": "job_unavailable"})
    with db.session() as session:
        assert session.get(Job, fresh).status == "validating_files"
