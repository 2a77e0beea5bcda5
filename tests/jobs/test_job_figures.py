"""The database figures behind the `openft_jobs` gauge and the time-to-first-step histogram
(storage/jobs.py `count_by_status`, `first_step_seconds`), on SQLite and PostgreSQL. Their export
through Ray is tested against a real cluster's metrics endpoint in tests/e2e/test_ray_dashboard.py."""

from __future__ import annotations

from jobs import transitions
from storage import jobs as jobs_repo
from storage.jobs import ENDED_STATUSES, OPEN_STATUSES
from tests.factories import db_account, db_create_job, db_training_file

NOW = 1_800_000_000


def test_jobs_by_status_names_every_status_and_counts_each_job_once(backend):
    _, db = backend()
    account = db_account(db)
    jobs = [db_create_job(db, account, db_training_file(db, account), now=NOW) for _ in range(2)]
    with db.session() as session:
        counts = jobs_repo.count_by_status(session)
    assert set(counts) == {*OPEN_STATUSES, *ENDED_STATUSES}  # a status with no job is 0, not missing
    assert sum(counts.values()) == 2 and counts["queued"] + counts["validating_files"] == 2
    with db.session() as session:
        assert transitions.start(session, jobs[0], NOW + 5, owner="c.1", lease_s=60, billing_enabled=False).ok
    with db.session() as session:
        counts = jobs_repo.count_by_status(session)
    assert counts["running"] == 1 and sum(counts.values()) == 2


def test_first_step_counts_from_the_current_runs_start_to_its_first_metrics_event(backend):
    _, db = backend()
    account = db_account(db)
    job_id = db_create_job(db, account, db_training_file(db, account), now=NOW)
    with db.session() as session:
        assert jobs_repo.first_step_seconds(session, job_id) is None  # no run yet
        assert transitions.start(session, job_id, NOW + 10, owner="c.1", lease_s=60, billing_enabled=False).ok
    with db.session() as session:
        jobs_repo.add_event(session, job_id, NOW + 9, "Step 1/9", type="metrics", data={"step": 1})  # an earlier run's
        jobs_repo.add_event(session, job_id, NOW + 12, "Tokenized.")  # not a step
        assert jobs_repo.first_step_seconds(session, job_id) is None
        jobs_repo.add_event(session, job_id, NOW + 40, "Step 1/9", type="metrics", data={"step": 1})
        jobs_repo.add_event(session, job_id, NOW + 41, "Step 2/9", type="metrics", data={"step": 2})
        assert jobs_repo.first_step_seconds(session, job_id) == 30.0
