"""The distill shortcut's part of a job's life: from create on a batch results file to admission.

Where it sits: job create (serve_app/services/fine_tuning_jobs.py) calls `begin` in its
transaction; the controller's pass (jobs/scheduling.py `claim_distills`) calls `take`; the
distiller (serve_app/services/distill.py `distill_job`, on a controller thread) ends with
`distilled` or `failed`. Each is a compare-and-set built on jobs/transitions.py, which owns the
status writes and the lease rules (its docstring: a distill lease is not a run's).

The life of such a job:
- create: `validating_files`, reason `distilling`, `training_file` the results file (so it cannot
  be deleted while the job is open), no quote yet, an event saying it is distilling;
- the controller takes a distill lease and writes "Distillation started." (a second one after a
  controller restart);
- `distilled`: the derived files and the checked spec and quote are recorded, the lease dropped,
  and the job admitted as any new one (`queued`, or waiting for the account's slot); a job paused
  meanwhile stays paused and waits for the slot once resumed;
- `failed`: the refusal that create would have answered with a 400 becomes the job's error (its
  code and param) and an error event; the job ends holding nothing (no slot, no hold, no charge).

Billing: a distilling job has no quote, so create checks no USD per day for it and it commits
nothing to the day; `distilled` checks the day's limit with the quote, under the account's lock,
and fails the job `limit_exceeded` when it does not fit. The credit hold stays at `start`, as for
every job.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs import limits, transitions
from jobs.spec import JobSpec
from openft.errors import RateLimited
from openft.settings import Settings
from storage.jobs import ENDED_STATUSES, add_event
from storage.models import Account, Job


def begin(session: Session, job: Job, now: int) -> None:
    """A new job on a batch results file (added by `transitions.add_new`): it waits to be distilled."""
    job.reason, job.waiting_since, job.updated_at = transitions.DISTILLING, now, now
    add_event(
        session, job.id, now,
        "Distilling training_file, a batch results file, into training and validation files; the job waits in "
        "validating_files until they are made and checked.",
        data={"code": "distilling", "results_file": job.training_file},
    )


def in_flight(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Job).where(
        Job.lease_owner.is_not(None), Job.reason == transitions.DISTILLING))


def take(session: Session, job_id: str, now: int, *, owner: str, lease_s: int) -> bool:
    """A waiting distill job with no distiller → leased to `owner`."""
    job = transitions.lock_job(session, job_id)
    if job is None or job.status != "validating_files" or job.reason != transitions.DISTILLING:
        return False
    if job.lease_owner is not None:
        return False
    job.lease_owner, job.lease_expires_at, job.updated_at = owner, now + lease_s, now
    add_event(session, job.id, now, "Distillation started.")
    return True


def owned(session: Session, job_id: str, owner: str) -> Job | None:
    """The job under its locks while `owner` still distills it (no cancel, no other distiller)."""
    job = transitions.owned(session, job_id, owner)
    return job if job is not None and job.reason == transitions.DISTILLING else None


def failed(session: Session, job_id: str, owner: str, now: int, *, code: str, message: str,
           param: str | None) -> transitions.Moved:
    job = owned(session, job_id, owner)
    if job is None:
        return transitions.Moved(False, None, "the lease is not the caller's")
    job.lease_owner = job.lease_expires_at = None
    return transitions.finish(session, job, "failed", now, error=transitions.job_error(code, message, param))


def distilled(
    session: Session, job_id: str, owner: str, now: int, *, spec: JobSpec, quote: dict,
    estimated_finish: int | None, derived_event: str, settings: Settings,
) -> transitions.Moved:
    """Record the derived files and the quote, then admit the job (or fail it over the USD-per-day limit)."""
    job = owned(session, job_id, owner)
    if job is None:
        return transitions.Moved(False, None, "the lease is not the caller's")
    if job.status in ENDED_STATUSES:  # not reached: `finish` drops a distill lease
        return transitions.Moved(False, job.status, f"the job is {job.status}")
    if settings.billing_enabled:
        account = session.get(Account, job.account_id)
        try:  # this job has no quote yet, so the day's sum does not count it twice
            limits.check_usd_per_day(session, account, settings, quote["per_token"]["max_charge_usd"], now)
        except RateLimited as refusal:
            job.lease_owner = job.lease_expires_at = None
            return transitions.finish(session, job, "failed", now, error=transitions.job_error(
                refusal.code, refusal.message))
    job.training_file, job.validation_file = spec.training_file, spec.validation_file
    job.spec, job.quote, job.estimated_finish = spec.record(), quote, estimated_finish
    job.lease_owner = job.lease_expires_at = None
    job.reason = None
    add_event(session, job.id, now, derived_event, data={"derived_from": spec.derived_from})
    if job.status == "paused":  # paused while it distilled: once resumed, it waits for the slot
        job.reason = transitions.WAITING_REASON
        add_event(session, job.id, now, "Files validated; the job stays paused until it is resumed.")
        return transitions.Moved(True, "paused")
    transitions.admit(session, job, now)
    return transitions.Moved(True, job.status)
