"""The distill shortcut's part of a job's life: from create on a batch results file to admission.

Where it sits: job create (serve_app/services/fine_tuning_jobs.py) calls `begin` in its
transaction; the worker's distill pass (worker/distills.py, through jobs/scheduling.py
`claim_distills`) calls `take` and then runs `distill_job` on a thread of its own under a heartbeat;
it ends with `distilled` or `failed`. Each is a compare-and-set on the job's distill lease
(storage/leases.py; jobs/transitions.py `DISTILL`: a distill lease is not a run's).

The life of such a job:
- create: `validating_files`, reason `distilling`, `training_file` the results file (so it cannot
  be deleted while the job is open), no quote yet, an event saying it is distilling;
- the worker takes a distill lease and writes "Distillation started." (again after a lost one);
- `distill_job` finds the batch's requests, distills them into objects under a prefix of this
  attempt's own, validates them as uploads and runs create's checks on them;
- `distilled`: in one transaction, the derived files' rows (within the account's file limits),
  the checked spec and quote, the lease dropped, and the job admitted as any new one (`queued`,
  or waiting for the account's slot); a job paused meanwhile stays paused and waits for the slot
  once resumed. The files are recorded with the admission or not at all, so a distiller killed
  at any point leaves no file behind for the next one to record again;
- `failed`: the refusal that create would have answered with a 400 becomes the job's error (its
  code and param) and an error event; the job ends holding nothing (no slot, no hold, no charge);
- `lose`: a distiller that died: the job is distilled again, or fails `platform_interrupted` once
  `DISTILL.max_attempts` leases were taken.

Billing: a distilling job has no quote, so create checks no USD per day for it and it commits
nothing to the day; `distilled` checks the day's limit with the quote, under the account's lock,
and fails the job `limit_exceeded` when it does not fit. The credit hold stays at `start`, as for
every job.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from files.distill import make_files, requests_file_for
from files.record import add_files, file_rows
from jobs import limits, transitions
from jobs.files import check_files
from jobs.params import file_not_found
from jobs.spec import JobSpec
from openft.errors import InvalidRequest, RateLimited, ServiceError
from openft.settings import Settings
from pipelines.distill import DistillOptions
from storage import files as files_repo
from storage import keys, leases
from storage.context import Context
from storage.jobs import ENDED_STATUSES, add_event
from storage.leases import Moved
from storage.models import Account, File, Job

DISTILL = transitions.DISTILL


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
    return session.scalar(select(func.count()).select_from(Job).where(DISTILL.held()))


def take(session: Session, job_id: str, now: int, *, owner: str, lease_s: int) -> bool:
    """A waiting distill job with no distiller → leased to `owner`; whether it was."""

    def ready(job: Job) -> str | None:
        waiting = job.status == "validating_files" and job.reason == transitions.DISTILLING
        return None if waiting else "it is not waiting to be distilled"

    moved = leases.claim(session, DISTILL, job_id, owner, now, lease_s, ready)
    if moved.ok:
        add_event(session, job_id, now, "Distillation started.")
    return moved.ok


def owned(session: Session, job_id: str, owner: str) -> Job | None:
    """The job under its locks while `owner` still distills it (no cancel, no other distiller)."""
    job = transitions.owned(session, job_id, owner)
    return job if job is not None and job.reason == transitions.DISTILLING else None


def lose(session: Session, job: Job, now: int) -> str:
    """The distiller is gone (its lease lapsed): distill the job again, or fail it once out of attempts."""
    leases.release(job)
    if leases.exhausted(DISTILL, job):
        transitions.finish(session, job, "failed", now, error=transitions.job_error(
            DISTILL.exhausted_code, "The worker distilling training_file was lost and the job is not distilled "
            "again. Create the job again, or call POST /v1/files/distill and create it on the files it makes.",
            "training_file"))
    else:
        add_event(session, job.id, now, "The distillation was lost with its worker; it starts again.", level="warn")
    return job.id


def failed(session: Session, job_id: str, owner: str, now: int, *, code: str, message: str,
           param: str | None) -> Moved:
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    leases.release(job)
    return transitions.finish(session, job, "failed", now, error=transitions.job_error(code, message, param))


def distilled(
    session: Session, state: Context, job_id: str, owner: str, now: int, *, spec: JobSpec, quote: dict,
    estimated_finish: int | None, files: list[File], derived_event: str,
) -> Moved:
    """Record the derived files, the spec and the quote, then admit the job (or fail it over the
    USD-per-day limit). A file limit the derived files pass raises its refusal (nothing recorded)."""
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    if job.status in ENDED_STATUSES:  # not reached: `finish` drops a distill lease
        return Moved(False, job.status, f"the job is {job.status}")
    if state.settings.billing_enabled:
        refusal = _over_the_day(session, job, state.settings, quote, now)
        if refusal is not None:
            leases.release(job)
            return transitions.finish(session, job, "failed", now, error=transitions.job_error(
                refusal.code, refusal.message))
    add_files(session, state, job.account_id, files)
    job.training_file, job.validation_file = spec.training_file, spec.validation_file
    job.spec, job.quote, job.estimated_finish = spec.record(), quote, estimated_finish
    leases.release(job)
    job.reason = None
    add_event(session, job.id, now, derived_event, data={"derived_from": spec.derived_from})
    if job.status == "paused":  # paused while it distilled: once resumed, it waits for the slot
        job.reason = transitions.WAITING_REASON
        add_event(session, job.id, now, "Files validated; the job stays paused until it is resumed.")
        return Moved(True, "paused")
    transitions.admit(session, job, now)
    return Moved(True, job.status)


def _over_the_day(session: Session, job: Job, settings: Settings, quote: dict, now: int) -> RateLimited | None:
    account = session.get(Account, job.account_id)
    try:  # this job has no quote yet, so the day's sum does not count it twice
        limits.check_usd_per_day(session, account, settings, quote["per_token"]["max_charge_usd"], now)
    except RateLimited as refusal:
        return refusal
    return None


# -- the distiller, on a worker thread ------------------------------------------------------------
def distill_job(state: Context, job_id: str, owner: str) -> None:
    """The distill shortcut in the background (the caller holds the job's distill lease as `owner`
    and renews it): find the batch's requests, distill with the defaults, run create's checks on the
    files and admit the job with them. A refusal that create would have answered with a 400 fails the
    job with its code; once the job is not this distiller's (a cancel, a lost lease) nothing more is
    recorded."""
    with state.db.session() as session:
        job = session.get(Job, job_id)
        if job is None or job.lease_owner != owner:
            return
        account_id, spec, attempt = job.account_id, JobSpec.from_record(job.spec), job.distill_attempts
    for earlier in range(1, attempt):  # what a lost distiller stored: never recorded, so nobody's
        state.store.delete_prefix(_prefix(account_id, job_id, earlier) + "/")
    try:
        _distill_for_job(state, account_id, job_id, owner, spec, _prefix(account_id, job_id, attempt))
    except ServiceError as refusal:
        param = refusal.param if refusal.param in ("training_file", "validation_file") else "training_file"
        message = refusal.message if refusal.param == param else f"Distilling training_file: {refusal.message}"

        def fail():
            with state.db.session() as session:
                failed(session, job_id, owner, state.now(), code=refusal.code or "invalid_request", message=message,
                       param=param)

        state.db.retrying(fail, budget_s=state.settings.db_outage_seconds, what="fail the distillation")


def _prefix(account_id: str, job_id: str, attempt: int) -> str:
    """Where one attempt's derived files are stored: its own, so two distillers never share objects."""
    return keys.distill_output(account_id, f"{job_id}-{attempt}")


def _distill_for_job(state: Context, account_id: str, job_id: str, owner: str, spec: JobSpec, prefix: str) -> None:
    with state.db.session() as session:
        results = files_repo.get_file(session, account_id, spec.derived_from["results_file"])
        validation = files_repo.get_file(session, account_id, spec.validation_file) if spec.validation_file else None
    if results is None:
        raise file_not_found("training_file")
    if spec.validation_file and validation is None:
        raise file_not_found("validation_file")
    requests, pick = requests_file_for(state, account_id, results)
    if requests is None:
        raise InvalidRequest(
            "training_file is a batch results file, but none of your batch files holds its requests. Upload the "
            "batch's input file with purpose=batch and create the job again, or call POST /v1/files/distill.",
            code="invalid_file_format", param="training_file",
        )
    made = make_files(state, account_id, results, requests, DistillOptions(), prefix=prefix, pick=pick)
    try:
        rows = dict(zip(made.files, file_rows(state, account_id, list(made.files.values()))))
        derived = {
            "results_file": results.id, "requests_file": requests.id, "training_file": rows["training_file"].id,
            "validation_file": rows["validation_file"].id if "validation_file" in rows else None,
            "counts": made.counts, "requests_pick": pick,
        }
        spec = replace(spec, training_file=derived["training_file"],
                       validation_file=spec.validation_file or derived["validation_file"]).with_derived(derived)
        if validation is None and spec.validation_file:
            validation = rows["validation_file"]
        quote = check_files(state, spec, rows["training_file"], validation)
        now = state.now()
        message = (f"Distilled {derived['results_file']} with its requests {derived['requests_file']} into "
                   f"{derived['training_file']} (training) and {derived['validation_file']} (validation).")

        def admit() -> Moved:
            with state.db.session() as session:
                return distilled(session, state, job_id, owner, now, spec=spec, quote=quote.record(),
                                 estimated_finish=quote.estimated_finish(now), files=list(rows.values()),
                                 derived_event=message)

        moved = state.db.retrying(admit, budget_s=state.settings.db_outage_seconds, what="record the distillation")
    except BaseException:
        made.discard(state)
        raise
    if moved.status in (None, "failed"):  # cancelled, taken over or over the day's limit: nothing recorded
        made.discard(state)
