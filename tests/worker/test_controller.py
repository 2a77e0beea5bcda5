"""The job controller's defects from issue 11, each reached through the real controller
(`Controller`, in-process, real Ray for the cluster's resources) on SQLite and PostgreSQL, with
scripted runs (tests/worker/runs.py) in place of Ray Train: the cap within one pass and across
passes, the cluster's capacity, the 24-hour wait clock, a cancel racing a start, a dead run thread,
two controllers on one database, a stalled run, the time limit from the run's start, and lost
workers. Real Ray Train runs of the same paths are in tests/faults."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import event, func, select

from jobs import scheduling, transitions
from storage.leases import due_kinds
from storage.models import Job, JobEvent
from tests.factories import db_account, db_create_job, db_training_file
from tests.utils.polling import until
from tests.worker.runs import ScriptedRuns
from worker.controller import Controller

DAY = 86400


def new_job(db, **kw) -> tuple[str, str]:
    account = db_account(db)
    return account, db_create_job(db, account, db_training_file(db, account), **kw)


def row(db, job_id: str) -> Job:
    with db.session() as session:
        return session.get(Job, job_id)


def messages(db, job_id: str) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)))


def leases(db) -> list[tuple[str, str]]:
    with db.session() as session:
        return session.execute(select(Job.id, Job.account_id).where(Job.lease_owner.is_not(None))).all()


def ended(db, job_id: str) -> Job:
    # A scripted run of 400 steps sleeps 8 s and writes each step: 20 s was not always enough on a
    # machine running two suites at once (load near 14); the wait ends as soon as the job does.
    return until(lambda: (j := row(db, job_id)).status in ("succeeded", "failed", "cancelled") and
                 j.lease_owner is None and j, f"end of {job_id}", 120)


def apply(db, move, job_id: str) -> transitions.Moved:
    """An API request's transition (cancel, pause, resume) in its own transaction, as the service runs it."""
    with db.session() as session:
        job = transitions.lock_job(session, job_id)
        return move(session, job, int(time.time()))


@pytest.fixture
def controllers():
    made: list[Controller] = []

    def make(settings, runs, **kw) -> Controller:
        ctl = Controller(settings, runs=runs, **kw)
        made.append(ctl)
        return ctl

    yield make
    for ctl in made:
        ctl.stop()
        for _, thread in list(ctl.runs.values()):
            thread.join(timeout=10)
        ctl.db.dispose()


def test_one_pass_starts_one_run_for_two_accounts_under_the_default_cap(backend, controllers, ray_cluster):
    """Defect: runs joined `self.runs` only after the loop, so one pass started every account's job."""
    settings, db = backend()  # max_concurrent_runs=1; a worker takes 1 CPU of the cluster's 2, 1 kept for Ray Data
    (_, first), (_, second) = new_job(db), new_job(db)
    ctl = controllers(settings, ScriptedRuns(steps=400, step_s=0.02))

    assert ctl.tick() == [first]
    assert ctl.tick() == []  # across passes too: the first run's lease counts
    assert len(leases(db)) == 1
    waiting = row(db, second)
    assert (waiting.status, waiting.reason) == ("queued", "gridline_capacity")
    assert messages(db, second)[-1] == "Waiting for a training worker to become free."

    assert apply(db, transitions.cancel, first).ok
    ended(db, first)
    assert until(lambda: ctl.tick(), "start of the second job") == [second]
    assert ended(db, second).status == "succeeded"


def statements(ctl: Controller, during) -> list[str]:
    """The SQL statements `during()` sends on the controller's database (SQLite's BEGIN IMMEDIATE aside)."""
    sent: list[str] = []

    def record(conn, cursor, statement, *args):
        if not statement.startswith("BEGIN"):
            sent.append(statement)

    event.listen(ctl.db.engine, "before_cursor_execute", record)
    try:
        during()
    finally:
        event.remove(ctl.db.engine, "before_cursor_execute", record)
    return sent


def due(ctl: Controller) -> set[str]:
    with ctl.db.session() as session:
        return due_kinds(session, [work.kind for work in ctl.work])


def test_an_idle_pass_is_one_query_and_a_kind_with_work_is_passed_again(backend, controllers, ray_cluster):
    """Issue 23: an idle pass reconciled and claimed every kind (26 statements, five of them taking
    the scheduler's lock, on SQLite a write each) every 0.3 s of every suite. Now one query says which
    kinds have a row due, and only those are passed; the sweeps keep their own clock."""
    settings, db = backend(controller_sweep_seconds=3600)
    ctl = controllers(settings, ScriptedRuns(steps=400, step_s=0.02))
    assert ctl.tick() == []  # the first pass sweeps
    idle = statements(ctl, ctl.tick)
    assert len(idle) == 1 and idle[0].lstrip().upper().startswith("SELECT"), idle
    assert due(ctl) == set()

    _, job = new_job(db)
    assert due(ctl) == {"run"}  # queued
    assert ctl.tick() == [job]
    assert due(ctl) == {"run"}  # leased: reconciled each pass
    assert len(statements(ctl, ctl.tick)) > 1
    assert apply(db, transitions.cancel, job).ok  # not its 8 s of steps: the run ends at its next beat
    assert ended(db, job).status == "cancelled"
    until(lambda: not ctl.active_runs(), "the run's thread to end")
    assert len(statements(ctl, ctl.tick)) == 1


@pytest.mark.parametrize("overrides", [
    {"max_concurrent_runs": 4},  # 2 CPUs: one worker's CPU and one for its Ray Data reads
    {"max_concurrent_runs": 4, "train_worker_resources": {"CPU": 1, "gpu_48gb": 1}},  # no node has it
    {"max_concurrent_runs": 4, "train_use_gpu": True, "train_worker_resources": {}},  # a CPU-only cluster
], ids=["cpu", "custom-resource", "gpu"])
def test_the_clusters_capacity_holds_below_a_higher_cap(backend, controllers, ray_cluster, overrides):
    settings, db = backend(**overrides)
    fits = scheduling.runs_that_fit(ray_cluster.cluster_resources(), scheduling.run_need(settings),
                                    {"CPU": settings.train_data_cpus})
    jobs = [new_job(db)[1] for _ in range(3)]
    ctl = controllers(settings, ScriptedRuns(steps=200, step_s=0.02))
    started = ctl.tick() + ctl.tick()
    assert len(started) == len(leases(db)) == min(fits, 3)
    assert fits == (1 if overrides.get("train_worker_resources") is None else 0)
    for job_id in set(jobs) - set(started):
        assert row(db, job_id).reason == "gridline_capacity"


def test_the_wait_limit_counts_from_the_current_wait_not_from_create(backend, controllers, ray_cluster):
    """Defect: a job paused and resumed (or requeued) over a day after create failed `job_unavailable`
    at once. Now the wait clock restarts with each wait, and a job that ran ends `job_expired`."""
    settings, db = backend(capacity_wait_limit_seconds=600)
    now = int(time.time())
    _, resumed = new_job(db, created_at=now - 2 * DAY)
    runs = ScriptedRuns(steps=10_000, step_s=0.02)
    ctl = controllers(settings, runs)
    assert ctl.tick() == [resumed]
    assert apply(db, transitions.pause, resumed).ok
    until(lambda: row(db, resumed).lease_owner is None, "the paused run's stop")
    assert apply(db, transitions.resume, resumed).status == "queued"
    scheduling.expire_waiting(db, int(time.time()), 600)  # no pass starts it: it waits
    assert row(db, resumed).status == "queued"  # 2 days after create, 0 s into this wait

    _, never_ran = new_job(db)
    _, ran_before = new_job(db)
    with db.session() as session:
        for job_id in (never_ran, ran_before):
            session.get(Job, job_id).waiting_since = now - 601
        session.get(Job, ran_before).started_at = now - 3600
    assert sorted(scheduling.expire_waiting(db, now, 600)) == sorted([never_ran, ran_before])
    assert (row(db, never_ran).error["code"], row(db, ran_before).error["code"]) == ("job_unavailable", "job_expired")
    assert "Nothing ran" in row(db, never_ran).error["message"]
    assert "Nothing ran" not in row(db, ran_before).error["message"]


def test_a_cancel_committed_during_a_start_pass_wins(postgres, controllers, ray_cluster):
    """Defect (PostgreSQL only): the pass read queued jobs without a lock and then wrote `running`,
    so a cancel committing in between was overwritten and the cancelled job trained."""
    settings, db = postgres()
    _, job_id = new_job(db)
    runs = ScriptedRuns()
    ctl = controllers(settings, runs)
    passes: list[list[str]] = []
    with db.session() as session:  # the API's cancel, held open while the pass runs
        job = transitions.lock_job(session, job_id)
        assert transitions.cancel(session, job, int(time.time())).ok
        racing = threading.Thread(target=lambda: passes.append(ctl.tick()))
        racing.start()
        time.sleep(1.0)
        assert racing.is_alive()  # the pass waits on the account's lock
    racing.join(timeout=20)
    assert passes == [[]] and runs.tickets == []
    job = row(db, job_id)
    assert (job.status, job.lease_owner, job.attempts, job.started_at) == ("cancelled", None, 0, None)
    assert "Fine-tuning job started." not in messages(db, job_id)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_run_whose_thread_died_is_requeued_at_the_next_pass(backend, controllers, ray_cluster):
    """Defect: `reconcile` ran only at the actor's start, so a run thread that died left its job
    `running` forever. Now every pass reconciles: the dead run's job is queued again once."""
    settings, db = backend()
    _, job_id = new_job(db)
    dying = ScriptedRuns(steps=3, crash=True)
    ctl = controllers(settings, dying)
    ctl.runs_work._end = lambda run, result: (_ for _ in ()).throw(SystemExit())  # the thread dies recording its end
    assert ctl.tick() == [job_id]
    until(lambda: not ctl.runs[job_id][1].is_alive(), "the run thread's death")
    assert row(db, job_id).status == "running"  # its lease is still set: nothing else has noticed
    ctl.executor = ScriptedRuns(steps=3)
    del ctl.runs_work._end
    assert ctl.reconcile() == [job_id]
    assert (row(db, job_id).status, row(db, job_id).lease_owner) == ("queued", None)
    assert until(lambda: ctl.tick(), "the retry's start") == [job_id]
    done = ended(db, job_id)
    assert (done.status, done.attempts) == ("succeeded", 2)
    assert sum("The run was lost" in m for m in messages(db, job_id)) == 1


def test_a_run_ray_lost_is_queued_again_not_failed(backend, controllers, ray_cluster):
    """Seen in tests/faults: when the service dies, Ray's node goes first and the still-running
    controller sees its run's task fail with NodeDiedError. That is a lost run (requeued once, then
    platform_interrupted), not a training failure; the database outlives Ray and keeps what it says."""
    settings, db = backend()
    _, job_id = new_job(db)
    ctl = controllers(settings, ScriptedRuns(steps=2, lose=True))
    assert ctl.tick() == [job_id]
    until(lambda: row(db, job_id).status == "queued", "the lost run's requeue")
    assert row(db, job_id).error is None and row(db, job_id).lease_owner is None
    assert until(lambda: ctl.tick(), "the second run's start") == [job_id]
    job = ended(db, job_id)
    assert (job.status, job.error["code"], job.attempts) == ("failed", "platform_interrupted", 2)


def test_two_controllers_never_both_drive_a_job_and_the_lease_hands_over(postgres, controllers, ray_cluster):
    settings, db = postgres(max_concurrent_runs=2, train_worker_resources={})
    jobs = [new_job(db)[1] for _ in range(3)]
    # B's runs outlast its five passes (1.5 s), even on a loaded machine: a run of B's that ended
    # within them would free a slot, and a third start would be within the cap, not past it.
    first_runs, second_runs = ScriptedRuns(steps=60, step_s=0.05), ScriptedRuns(steps=3, step_s=0.5)
    a, b = controllers(settings, first_runs), controllers(settings, second_runs)
    with_a: list[str] = []
    barrier = threading.Barrier(2)

    def passes(ctl, out):
        barrier.wait()
        for _ in range(5):
            out.extend(ctl.tick())

    with_b: list[str] = []
    threads = [threading.Thread(target=passes, args=(a, with_a)), threading.Thread(target=passes, args=(b, with_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(with_a + with_b) == len(set(with_a + with_b)) == 2  # the cap, across both
    assert len(leases(db)) == 2

    # A dies without a word: its leases lapse and B takes its jobs over, from their checkpoints.
    a.stop()
    for runner in first_runs.launched:
        runner.abort()
    for job_id in jobs:
        until(lambda: b.tick() is not None and row(db, job_id).status in ("succeeded", "failed"), f"end of {job_id}",
              timeout=40)
    for job_id in jobs:
        job = row(db, job_id)
        assert job.status == "succeeded", job.error
        assert job.attempts == (2 if job_id in with_a else 1)
        assert messages(db, job_id).count("The job has successfully completed.") == 1


def test_a_stalled_run_is_stopped_and_fails_training_failed(backend, controllers, ray_cluster):
    settings, db = backend(run_stall_seconds=1.5)
    _, job_id = new_job(db)
    runs = ScriptedRuns(hang=True)
    ctl = controllers(settings, runs)
    assert ctl.tick() == [job_id]
    job = ended(db, job_id)
    assert (job.status, job.error["code"]) == ("failed", "training_failed")
    assert "no progress for 2 s" in job.error["message"]
    assert runs.launched[0].aborted.is_set()


def test_the_time_limit_counts_every_run_from_its_start(backend, controllers, ray_cluster):
    """Defect: the limit was checked between training steps only, after the first eval. Now the
    controller's deadline starts with the run and carries the earlier runs' seconds."""
    settings, db = backend(job_time_limit_seconds=3)
    _, job_id = new_job(db)
    runs = ScriptedRuns(steps=10_000, step_s=0.05)  # it keeps stepping: no stall, only the limit stops it
    ctl = controllers(settings, runs)
    assert ctl.tick() == [job_id]
    time.sleep(1.2)
    assert apply(db, transitions.pause, job_id).ok
    until(lambda: row(db, job_id).lease_owner is None, "the paused run's stop")
    spent = row(db, job_id).run_seconds
    assert spent >= 1
    apply(db, transitions.resume, job_id)
    until(lambda: ctl.tick(), "the resumed run's start")
    second = runs.tickets[-1]
    assert second.deadline == pytest.approx(row(db, job_id).run_started_at + 3 - spent)
    job = ended(db, job_id)
    assert (job.status, job.error["code"]) == ("failed", "time_limit_exceeded")
    assert runs.launched[-1].aborted.is_set()


def test_a_run_that_is_not_the_leaseholder_writes_nothing(backend, controllers, ray_cluster):
    """A run whose lease was taken over (its controller was presumed dead) stops at its next
    control poll and its end is not recorded."""
    settings, db = backend()
    _, job_id = new_job(db)
    runs = ScriptedRuns(steps=2000, step_s=0.01)
    ctl = controllers(settings, runs)
    assert ctl.tick() == [job_id]
    until(lambda: runs.launched, "the run's launch")  # displaced once it runs, not before it read its ticket
    with db.session() as session:  # another controller's reconcile and start, as the lease decides
        job = transitions.lock_job(session, job_id)
        job.lease_owner = "ctl-other.run"
    until(lambda: not ctl.runs[job_id][1].is_alive(), "the displaced run's stop")
    job = row(db, job_id)
    assert (job.status, job.lease_owner, job.fine_tuned_model) == ("running", "ctl-other.run", None)
    assert runs.launched[0].result.status == "cancelled"


def test_lost_workers_are_platform_interrupted_and_raised_code_is_training_failed():
    from ray.exceptions import ActorDiedError
    from ray.train import WorkerGroupError

    from train.launcher import worker_lost

    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    assert worker_lost(WorkerGroupError("lost", {0: ActorDiedError()}))
    # What a SIGKILLed worker reaches Ray Train's controller as (seen in tests/faults).
    assert worker_lost(WorkerGroupError("lost", {0: WorkerHealthCheckFailedError("poll failed", ActorDiedError())}))
    assert not worker_lost(WorkerGroupError("raised", {0: ValueError("a bug")}))


def test_every_status_count_balances_after_a_cancelled_queue(backend, controllers, ray_cluster):
    settings, db = backend()
    jobs = [new_job(db)[1] for _ in range(3)]
    ctl = controllers(settings, ScriptedRuns(steps=50, step_s=0.02))
    ctl.tick()
    for job_id in jobs:
        apply(db, transitions.cancel, job_id)
    until(lambda: not leases(db), "every run's stop")
    with db.session() as session:
        counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    assert counts == {"cancelled": 3}
