"""Open jobs through the official `openai` SDK against the Serve app (SQLite and PostgreSQL):
parallel creates against the open-job limit, admission of a second job behind the account's
slot, and cancel, pause and resume from every status. States only the job controller sets
(`running`, `succeeded`, `failed`, `registering`) are written to the jobs table directly: the
database is the source of truth the controller writes too."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from sqlalchemy import func, select, update

from storage.db import Database
from jobs.transitions import lock_account, promote_waiting
from storage.models import Job
from tests.factories import create_jobs_in_parallel
from tests.serve_app.test_jobs_api import TRAIN, job_ids, upload

MODEL = "qwen2.5-0.5b-instruct"


@pytest.fixture(scope="module")
def db(api):
    database = Database(api.settings.resolved_database_url(), migrate=False)
    yield database
    database.dispose()


def set_job(db: Database, job_id: str, **values) -> None:
    with db.session() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def job_row(db: Database, job_id: str) -> Job:
    with db.session() as session:
        return session.get(Job, job_id)


def messages(client, job_id: str) -> list[str]:
    return [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]


def invalid_state(call, job_id: str) -> str:
    with pytest.raises(openai.ConflictError) as info:
        call(job_id)
    assert (info.value.status_code, info.value.body["code"]) == (409, "invalid_state")
    return info.value.body["message"]


def test_parallel_creates_fill_the_limit_exactly(api, db):
    account_id, key = api.create_account(open_jobs=2)
    client = api.client(key)
    train = upload(client, TRAIN).id

    results = create_jobs_in_parallel(client, 6, model=MODEL, training_file=train)
    created = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(created) == 2 and len(refused) == 4
    assert all(r.body["code"] == "limit_exceeded" and r.body["limit"] == {"limit": 2, "current": 2} for r in refused)
    assert sorted(job_ids(client)) == sorted(j.id for j in created)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account_id == account_id)) == 2
    # One holds the account's slot, the other waits behind it; both with their events.
    assert sorted(j.status for j in created) == ["queued", "validating_files"]
    assert all(len(messages(client, j.id)) == 2 for j in created)


def test_second_job_waits_for_capacity_then_is_promoted(api):
    _, key = api.create_account(open_jobs=3)
    client = api.client(key)
    train = upload(client, TRAIN).id
    first = client.fine_tuning.jobs.create(model=MODEL, training_file=train)
    second = client.fine_tuning.jobs.create(model=MODEL, training_file=train)
    assert (first.status, first.model_extra["gridline"]["reason"]) == ("queued", None)
    assert (second.status, second.model_extra["gridline"]["reason"]) == ("validating_files", "account_capacity")
    waiting = client.fine_tuning.jobs.list_events(second.id, limit=1).data[0]
    assert waiting.message.startswith("waiting_for_capacity: ") and waiting.data["code"] == "waiting_for_capacity"

    cancelled = client.fine_tuning.jobs.cancel(first.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at >= cancelled.created_at
    promoted = client.fine_tuning.jobs.retrieve(second.id)
    assert (promoted.status, promoted.model_extra["gridline"]["reason"]) == ("queued", None)
    assert messages(client, second.id)[0] == "Capacity available: job queued."


def test_cancel_pause_resume_from_each_waiting_status(api, db):
    _, key = api.create_account(open_jobs=4)
    client = api.client(key)
    jobs = client.fine_tuning.jobs
    train = upload(client, TRAIN).id
    holder = jobs.create(model=MODEL, training_file=train)
    waiting = jobs.create(model=MODEL, training_file=train)
    assert (holder.status, waiting.status) == ("queued", "validating_files")

    # A waiting job pauses and resumes into waiting, behind the job that still holds the slot.
    assert jobs.pause(waiting.id).status == "paused"
    invalid_state(jobs.pause, waiting.id)
    resumed = jobs.resume(waiting.id)
    assert (resumed.status, resumed.model_extra["gridline"]["reason"]) == ("validating_files", "account_capacity")

    # A paused queued job keeps the slot; resumed, it is queued again.
    paused = jobs.pause(holder.id)
    assert (paused.status, paused.estimated_finish) == ("paused", None)
    assert jobs.retrieve(waiting.id).status == "validating_files"
    assert messages(client, holder.id)[0] == "Fine-tuning job paused (was queued)."
    assert jobs.resume(holder.id).status == "queued"
    invalid_state(jobs.resume, holder.id)

    cancelled = jobs.cancel(waiting.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    for call in (jobs.cancel, jobs.pause, jobs.resume):
        assert "it is cancelled" in invalid_state(call, waiting.id)

    jobs.pause(holder.id)
    cancelled = jobs.cancel(holder.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    assert messages(client, holder.id)[0] == "Fine-tuning job cancelled."

    # A job paused while it waited and resumed once the slot is free is queued at once.
    third, fourth = jobs.create(model=MODEL, training_file=train), jobs.create(model=MODEL, training_file=train)
    jobs.pause(fourth.id)
    jobs.cancel(third.id)
    assert jobs.retrieve(fourth.id).status == "paused"  # not promoted while paused
    assert jobs.resume(fourth.id).status == "queued"
    assert job_row(db, fourth.id).reason is None


def test_cancel_and_pause_from_the_controllers_statuses(api, db):
    _, key = api.create_account(open_jobs=4)
    client = api.client(key)
    jobs = client.fine_tuning.jobs
    train = upload(client, TRAIN).id
    created = [jobs.create(model=MODEL, training_file=train) for _ in range(4)]
    running, done, failed, registering = (j.id for j in created)
    set_job(db, done, status="succeeded", finished_at=created[1].created_at + 60)
    set_job(db, failed, status="failed", finished_at=created[2].created_at + 60,
            error={"code": "training_failed", "message": "Training failed.", "param": None})
    set_job(db, registering, status="running", control="registering")
    set_job(db, running, status="running")

    for job_id, status in ((done, "succeeded"), (failed, "failed")):
        for call in (jobs.cancel, jobs.pause, jobs.resume):
            assert f"it is {status}" in invalid_state(call, job_id)
    for call in (jobs.cancel, jobs.pause):
        assert "registering its adapter" in invalid_state(call, registering)
    assert job_row(db, registering).status == "running"
    assert jobs.retrieve(failed).error.code == "training_failed"

    # Pausing a running job asks its run to checkpoint and stop; resuming queues it again.
    assert jobs.pause(running).status == "paused"
    assert (job_row(db, running).control, job_row(db, running).paused_from) == ("pause", "running")
    assert jobs.resume(running).status == "queued"
    set_job(db, running, status="running")

    cancelled = jobs.cancel(running)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    row = job_row(db, running)
    assert (row.status, row.control) == ("cancelled", "cancel")
    invalid_state(jobs.cancel, running)


def test_only_one_job_takes_a_freed_slot(api, db):
    """Resuming a job paused while it waited, with the slot free, promotes it. While that
    transaction is open, another resume and a create both look for the slot's holder: they wait
    for the account row and then see the promoted job, so neither takes the slot too."""
    account_id, key = api.create_account(open_jobs=5)
    jobs = api.client(key).fine_tuning.jobs
    train = upload(api.client(key), TRAIN).id
    holder, first, second = (jobs.create(model=MODEL, training_file=train) for _ in range(3))
    jobs.pause(first.id)
    jobs.pause(second.id)
    jobs.cancel(holder.id)  # the slot is free; paused jobs are not promoted
    with ThreadPoolExecutor(2) as pool:
        with db.session() as session:
            # resume_job's steps for `first`, held open.
            lock_account(session, account_id)
            row = session.get(Job, first.id, with_for_update=True)
            row.status, row.paused_from = "validating_files", None
            session.flush()
            assert promote_waiting(session, account_id, row.updated_at) is row
            resumed = pool.submit(jobs.resume, second.id)
            created = pool.submit(jobs.create, model=MODEL, training_file=train)
            time.sleep(1.5)
            assert not resumed.done() and not created.done()
        assert resumed.result().status == created.result().status == "validating_files"
    assert jobs.retrieve(first.id).status == "queued"
    statuses = [j.status for j in jobs.list()]
    assert sorted(statuses) == ["cancelled", "queued", "validating_files", "validating_files"]
