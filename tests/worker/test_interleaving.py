"""Random interleavings of the API's requests against the running controller, on PostgreSQL.

200 random creates, cancels, pauses and resumes over 3 accounts, while the real controller's loop
(`Controller(..., loop=True)`) schedules and drives scripted runs (tests/worker/runs.py), billing
on. After every step, in one snapshot of the database: no account has two runs or two jobs in its
slot, the cap is never exceeded, no accepted cancel is lost, every ended job ended once and stays
ended, and the ledger balances (a hold per started job, released once it ends, a charge only for a
succeeded job, at most one of each). At the end, once the runs have drained, every succeeded job
has exactly one model and one charge.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict

import pytest
from sqlalchemy import select

from jobs import transitions
from storage.models import FineTunedModel, Job, JobEvent, LedgerEntry
from tests.factories import db_account, db_create_job, db_training_file
from tests.worker.runs import ScriptedRuns
from worker.controller import Controller

OPS = 200
CAP = 2
FITS = {"cancel": ("validating_files", "queued", "running", "paused"), "pause": ("validating_files", "queued", "running"),
        "resume": ("paused",)}
END_MESSAGES = ("Fine-tuning job cancelled.", "The job has successfully completed.")


class Model:
    """What the test's requests were told, to check the database against."""

    def __init__(self):
        self.cancelled: set[str] = set()
        self.ended: dict[str, str] = {}


def snapshot_check(db, model: Model, step: str) -> None:
    with db.session() as session:
        # One snapshot for every read below (READ COMMITTED would give each statement its own).
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        jobs = session.scalars(select(Job)).all()
        events = session.execute(select(JobEvent.job_id, JobEvent.message, JobEvent.level)).all()
        ledger = session.execute(select(LedgerEntry.job_id, LedgerEntry.kind)).all()
        models = session.scalars(select(FineTunedModel.job_id)).all()
    where = f"after {step}"
    leased = [j for j in jobs if j.lease_owner is not None]
    assert len(leased) <= CAP, where
    runs = Counter(j.account_id for j in leased)
    assert max(runs.values(), default=0) <= 1, f"an account has two runs {where}"
    slots = Counter(j.account_id for j in jobs if j.status in ("queued", "running")
                    or (j.status == "paused" and j.paused_from != "validating_files"))
    assert max(slots.values(), default=0) <= 1, f"an account has two jobs in its slot {where}"

    ends = Counter(job_id for job_id, message, level in events if message in END_MESSAGES or level == "error")
    entries = defaultdict(Counter)
    for job_id, kind in ledger:
        if job_id:
            entries[job_id][kind] += 1
    model_rows = Counter(models)
    for job in jobs:
        kinds = entries[job.id]
        assert all(n <= 1 for n in kinds.values()), f"{job.id} holds or charges twice {where}"
        if job.id in model.cancelled:
            assert job.status == "cancelled", f"lost cancel of {job.id} {where}"
            assert model_rows[job.id] == 0
        if job.status in ("succeeded", "failed", "cancelled"):
            assert model.ended.setdefault(job.id, job.status) == job.status, f"{job.id} ended twice {where}"
            assert ends[job.id] == 1, f"{job.id} has {ends[job.id]} end events {where}"
            assert kinds["release"] == kinds["hold"], f"{job.id} ended holding credit {where}"
            assert kinds["charge"] <= (job.status == "succeeded")
        else:
            assert ends[job.id] == 0 and job.finished_at is None, where
            assert kinds["release"] == kinds["charge"] == 0, where
            assert kinds["hold"] == (job.started_at is not None), f"{job.id} hold without a start {where}"
        assert model_rows[job.id] == (job.status == "succeeded" and job.fine_tuned_model is not None), where


@pytest.mark.parametrize("seed", [11])
def test_random_requests_against_the_running_controller_keep_every_invariant(postgres, ray_cluster, seed):
    settings, db = postgres(max_concurrent_runs=CAP, train_worker_resources={}, billing_enabled=True)
    accounts = [db_account(db, open_jobs=3, deposit_usd="1000.00") for _ in range(3)]
    files = {a: db_training_file(db, a) for a in accounts}
    ctl = Controller(settings, runs=ScriptedRuns(steps=8, step_s=0.03), loop=True)
    rng, model, jobs, done = random.Random(seed), Model(), [], Counter()
    try:
        for i in range(OPS):
            op = rng.choices(("create", "cancel", "pause", "resume", "wait"), weights=(4, 2, 2, 3, 2))[0]
            if op == "create":
                account = rng.choice(accounts)
                made = db_create_job(db, account, files[account])
                if isinstance(made, str):
                    jobs.append(made)
                done[op if isinstance(made, str) else "create refused"] += 1
            elif op == "wait" or not jobs:
                time.sleep(rng.uniform(0.02, 0.3))
                op = "wait"
            else:
                # Mostly aim at a job whose status fits the request (it can move on before the request
                # lands: that race is the point), sometimes at any job (a refusal).
                with db.session() as session:
                    fitting = session.scalars(select(Job.id).where(Job.status.in_(FITS[op]))).all()
                job_id = rng.choice(fitting if fitting and rng.random() < 0.85 else jobs)
                with db.session() as session:
                    job = transitions.lock_job(session, job_id)
                    moved = getattr(transitions, op)(session, job, int(time.time()))
                if moved.ok and op == "cancel":
                    model.cancelled.add(job_id)
                done[op + ("" if moved.ok else " refused")] += 1
            snapshot_check(db, model, f"step {i} ({op})")

        # Drain: resume what is paused, then let every run end.
        for job_id in jobs:
            with db.session() as session:
                transitions.resume(session, transitions.lock_job(session, job_id), int(time.time()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with db.session() as session:
                open_jobs = session.scalar(select(Job.id).where(Job.status.in_(
                    ("validating_files", "queued", "running", "paused"))).limit(1))
            snapshot_check(db, model, "drain")
            if open_jobs is None:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the jobs did not drain within 120 s")
    finally:
        ctl.stop()
    with db.session() as session:
        statuses = Counter(session.scalars(select(Job.status)))
        charges = session.scalars(select(LedgerEntry.job_id).where(LedgerEntry.kind == "charge")).all()
        succeeded = session.scalars(select(Job.id).where(Job.status == "succeeded")).all()
    assert sorted(charges) == sorted(succeeded)  # each succeeded job charged exactly once
    assert statuses["succeeded"] > 0 and statuses["cancelled"] > 0  # the run exercised both ends
    assert done["pause"] > 0 and done["resume"] > 0 and done["create"] >= 10, done
    print(f"interleaving seed {seed}: {dict(done)}; end statuses {dict(statuses)}")
