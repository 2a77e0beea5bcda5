"""Every change of a job's status, and the run lease that decides who drives a job.

Where it sits: the API's services (create, cancel, pause, resume) and the job controller (start,
run ends, lost runs, expired waits) call these inside their own transaction; nothing else writes
`Job.status`. Each function writes the event that says what happened, so a job's status and its
events never disagree.

Compare-and-set: each transition first takes the locks, re-reads the row, checks the status it
expects (and, for a run, that the caller still holds the job's lease) and changes nothing when the
row has moved on, returning `Moved(ok=False, ...)` that says why. Callers never decide from a row
they read earlier without a lock. The leases, the lock order (the scheduler's row, the account's,
then its job rows), `Moved` and the attempt rule are storage/leases.py's, shared by every kind of
background work; this module declares the job's two kinds (`RUN`, `DISTILL`) and writes its states.

Slots and runs are different things:
- The account's slot (what a user sees): one `queued`, `running` or `paused` job per account; later
  jobs wait in `validating_files` (`admit`, `promote_waiting`).
- A run (what uses a worker): a job whose `lease_owner` is set. `start` sets the lease, the run's
  heartbeat renews it, and the run clears it when it stops (`run_ended`). A lease that expires is a
  lost run (`lose_run`). The concurrency cap, the cluster's capacity and "one run per account"
  count leases, not statuses: a cancelled job's run holds its worker until it has stopped.

What happens when a job is cancelled while it starts: `cancel` and `start` take the same account
and job locks, so one commits first. If the cancel does, `start` finds the job `cancelled` and does
nothing. If the start does, the cancel ends the job (`cancelled`, charge settled, the account's slot
handed on) and sets `control = "cancel"`; the run reads it at its next check (before tokenizing
ends, at every step) and stops; `begin_registering` refuses a cancelled job, so no model is
registered; the run's `run_ended` clears the lease, and only then may the account's next job start.

The distill shortcut (a job created on a batch results file) waits in `validating_files` with
`reason = "distilling"` until the worker has distilled it (jobs/distilling.py). The worker takes a
lease on it as it does for a run, but a distill lease is not a run: the run cap and "one run per
account" skip it (`RUN.scope`), and it exists only while the reason is `distilling`: `finish` (a
cancel, an expired wait) drops it, so the distiller's own compare-and-set (`distilled`, `failed`)
then finds the lease gone and records nothing more. A distiller that dies lets its lease lapse;
reconciliation clears it (the job keeps its status) and the next pass distills the job again, up
to `DISTILL.max_attempts` leases (`distill_attempts`), then the job fails `platform_interrupted`.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from openft import metrics
from storage import billing, leases
from storage.jobs import ENDED_STATUSES, add_event
from storage.leases import Kind, Moved, lock_account
from storage.models import Job
from webhooks import events, outbox

SLOT_STATUSES = ("queued", "running", "paused")
PAUSABLE = ("validating_files", "queued", "running")
WAITING_REASON = "account_capacity"
DISTILLING = "distilling"  # the reason of a distill-shortcut job until its derived files are made and checked

_DISTILLING = (Job.reason == DISTILLING)
# A run: what the run cap and "one run per account" count. Two attempts: the first run and one
# retry from the last checkpoint; a run lost with no attempt left fails `platform_interrupted`.
# Its pass starts queued jobs and expires every job that waited too long, a distill's included.
RUN = Kind("run", Job, "r", max_attempts=2, exhausted_code="platform_interrupted",
           scope=or_(Job.reason.is_(None), ~_DISTILLING), needs_lease=Job.status == "running",
           pending=Job.status.in_(("validating_files", "queued")))
# A distiller of a distill-shortcut job: not a run (it holds no training worker).
DISTILL = Kind("distill", Job, "d", max_attempts=2, exhausted_code="platform_interrupted", attempts="distill_attempts",
               scope=_DISTILLING, pending=(Job.status == "validating_files") & _DISTILLING)


def job_error(code: str, message: str, param: str | None = None) -> dict:
    return {"code": code, "message": message, "param": param}


def lock_job(session: Session, job_id: str, account_id: str | None = None) -> Job | None:
    return leases.lock_row(session, Job, job_id, account_id)


# -- the account's slot -----------------------------------------------------------------------------
def holds_slot(session: Session, account_id: str, *, except_job: str | None = None) -> bool:
    holding = Job.status.in_(SLOT_STATUSES) & ~((Job.status == "paused") & (Job.paused_from == "validating_files"))
    query = select(Job.id).where(Job.account_id == account_id, holding)
    if except_job:
        query = query.where(Job.id != except_job)
    return session.scalar(query.limit(1)) is not None


def add_new(session: Session, job: Job, now: int) -> None:
    """Insert a job create built (the caller holds the account's lock and checked the limits): it
    starts in `validating_files`, with its first event; `admit` then queues it or lets it wait."""
    job.status = "validating_files"
    session.add(job)
    session.flush()
    add_event(session, job.id, now, f"Created fine-tuning job: {job.id}")


def admit(session: Session, job: Job, now: int) -> None:
    """A new job (the caller holds the account's lock and added the row): queue it, or let it wait
    for the account's slot."""
    lock_account(session, job.account_id)
    job.waiting_since, job.updated_at = now, now
    if holds_slot(session, job.account_id, except_job=job.id):
        job.status, job.reason = "validating_files", WAITING_REASON
        add_event(
            session, job.id, now,
            "waiting_for_capacity: your account trains one job at a time; this job starts when the one "
            "training now ends. It retries automatically: do not resubmit it.",
            data={"code": "waiting_for_capacity", "reason": WAITING_REASON},
        )
    else:
        job.status, job.reason = "queued", None
        add_event(session, job.id, now, "Files validated, job queued: a worker starts it when capacity is free.")


def promote_waiting(session: Session, account_id: str, now: int) -> Job | None:
    """When the account's slot frees, queue its oldest waiting job (its wait goes on: the clock keeps running)."""
    lock_account(session, account_id)
    if holds_slot(session, account_id):
        return None
    job = session.scalar(
        select(Job)
        .where(Job.account_id == account_id, Job.status == "validating_files",
               or_(Job.reason.is_(None), Job.reason != DISTILLING))  # a distilling job has no files to train on yet
        .order_by(Job.created_ns.asc())
        .limit(1)
        .with_for_update()
    )
    if job is not None:
        job.status, job.reason, job.updated_at = "queued", None, now
        add_event(session, job.id, now, "Capacity available: job queued.")
    return job


def finish(
    session: Session, job: Job, status: str, now: int, *, error: dict | None = None, message: str | None = None
) -> Moved:
    """End an open job (succeeded, failed, cancelled), settle its charge and hand the account's slot
    on. The caller holds the job's lock (`lock_job`). An ended job is left as it is."""
    assert status in ENDED_STATUSES
    if job.status in ENDED_STATUSES:
        return Moved(False, job.status, f"the job is {job.status} already")
    lock_account(session, job.account_id)
    if job.reason == DISTILLING:  # the distiller's lease ends with the job: its result is discarded
        leases.release(job)
        job.control = None
    job.status, job.finished_at, job.updated_at, job.reason = status, now, now, None
    job.estimated_finish = None
    job.waiting_since = None
    if error is not None:
        job.error = error
        add_event(session, job.id, now, f"{error['code']}: {error['message']}", level="error",
                  data={"code": error["code"]})
    elif message:
        add_event(session, job.id, now, message)
    billing.settle(session, job, now)  # the charge commits with the end status, once
    outbox.enqueue(session, job.account_id, events.JOB_EVENTS[status], job.id, now)  # and its webhooks
    session.flush()
    promote_waiting(session, job.account_id, now)
    return Moved(True, status)


# -- the API's requests -----------------------------------------------------------------------------
def _state(job: Job) -> str:
    return "registering its adapter" if job.control == "registering" else job.status


def cancel(session: Session, job: Job, now: int) -> Moved:
    """A running job's run sees `control = cancel` at its next check and stops without registering;
    its lease holds the worker until then (see the module docstring)."""
    if job.status in ENDED_STATUSES or job.control == "registering":
        return Moved(False, job.status, _state(job))
    job.control = "cancel" if job.lease_owner is not None or job.status in ("running", "paused") else None
    return finish(session, job, "cancelled", now, message="Fine-tuning job cancelled.")


def pause(session: Session, job: Job, now: int) -> Moved:
    """A running job checkpoints at its next step and stops; a paused job keeps the account's slot."""
    if job.status not in PAUSABLE or job.control == "registering":
        return Moved(False, job.status, _state(job))
    was = job.status
    job.status, job.updated_at, job.estimated_finish = "paused", now, None
    job.control = "pause" if was == "running" else None
    job.paused_from, job.waiting_since = was, None
    add_event(session, job.id, now, f"Fine-tuning job paused (was {was}).")
    return Moved(True, "paused")


def resume(session: Session, job: Job, now: int) -> Moved:
    """A job paused while waiting keeps waiting; anything else goes back to the queue, and its wait
    starts now: time spent paused never counts toward the 24-hour wait."""
    if job.status != "paused":
        return Moved(False, job.status, _state(job))
    job.status = "validating_files" if job.paused_from == "validating_files" else "queued"
    job.control, job.paused_from, job.updated_at, job.waiting_since = None, None, now, now
    add_event(session, job.id, now, "Fine-tuning job resumed.")
    if job.status == "validating_files":
        session.flush()
        promote_waiting(session, job.account_id, now)
    return Moved(True, job.status)


# -- runs: start, heartbeat, end, loss ---------------------------------------------------------------
def account_has_run(session: Session, account_id: str, *, except_job: str | None = None) -> bool:
    query = select(Job.id).where(Job.account_id == account_id, RUN.held())
    if except_job:
        query = query.where(Job.id != except_job)
    return session.scalar(query.limit(1)) is not None


def start(session: Session, job_id: str, now: int, *, owner: str, lease_s: int, billing_enabled: bool) -> Moved:
    """`queued` with no run → `running` with a lease for `owner`. Billing on: the job's most is held
    first, and a job the account's credit cannot fund fails `insufficient_quota` instead."""
    job = lock_job(session, job_id)
    if job is None:
        return Moved(False, None, "no such job")
    if job.status != "queued" or job.lease_owner is not None:
        return Moved(False, job.status, f"the job is {job.status}" if job.status != "queued" else "a run drives it")
    if account_has_run(session, job.account_id, except_job=job.id):
        return Moved(False, job.status, "the account has a run")
    if billing_enabled and not billing.hold(session, job, now):
        finish(session, job, "failed", now, error=job_error("insufficient_quota", billing.shortfall_message(session, job)))
        return Moved(False, "failed", "insufficient_quota: the account's credit cannot fund it")
    leases.take(RUN, job, owner, now, lease_s)
    job.status, job.reason, job.control, job.updated_at = "running", None, None, now
    job.started_at = job.started_at or now
    job.progress_at = now
    waited = now - (job.waiting_since if job.waiting_since is not None else job.created_at)
    metrics.record_queue_wait(waited, model=job.model)
    job.run_started_at, job.waiting_since = now, None
    add_event(session, job.id, now, "Fine-tuning job started.")
    return Moved(True, "running")


def progress(session: Session, job_id: str) -> int | None:
    """What the run's heartbeat reads beside its renewal: when the run last wrote (the stall watchdog)."""
    return session.scalar(select(Job.progress_at).where(Job.id == job_id))


def _release(job: Job, now: int) -> None:
    if job.run_started_at is not None:
        job.run_seconds = (job.run_seconds or 0.0) + max(0, now - job.run_started_at)
    leases.release(job)
    job.run_started_at = job.run_placement_group = None
    if job.control in ("pause", "cancel", "registering"):
        job.control = None


def owned(session: Session, job_id: str, owner: str) -> Job | None:
    """The job under its locks if `owner` still holds its lease, else None."""
    return leases.owned(session, Job, job_id, owner)


def run_ended(session: Session, job_id: str, owner: str, now: int, *, paused: bool) -> Moved:
    """The run stopped by itself without a result: it saw `pause` (and checkpointed) or `cancel`."""
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    _release(job, now)
    if paused:
        job.attempts -= 1  # a pause is not a lost run: the resumed run keeps its retry
        if job.status == "paused":
            add_event(session, job.id, now, "Checkpoint saved; job paused.")
    return Moved(True, job.status)


def run_lost(session: Session, job_id: str, owner: str, now: int) -> Moved:
    """The run's own driver saw it lost (its task's worker or node died): `lose_run`, with the lease proven."""
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    return lose_run(session, job, now)


def run_failed(session: Session, job_id: str, owner: str, now: int, code: str, message: str) -> Moved:
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    _release(job, now)
    if job.status in ENDED_STATUSES:  # cancelled while it failed: the cancel stands
        return Moved(False, job.status, f"the job is {job.status}")
    return finish(session, job, "failed", now, error=job_error(code, message))


def begin_registering(session: Session, job_id: str, owner: str, now: int) -> Moved:
    """The run finished training: mark the job `registering` (cancel and pause now answer 409), or
    refuse when it was cancelled or paused while the last step ran (then nothing is registered)."""
    job = owned(session, job_id, owner)
    if job is None:
        return leases.NOT_OWNED
    if job.status == "queued" and job.control is None:
        # Paused and resumed before the run saw the pause: the run never stopped, so its
        # finished adapter stands instead of a restart from the last checkpoint.
        job.status = "running"
    if job.status != "running":
        was = job.status
        _release(job, now)
        if was == "paused":
            job.attempts -= 1
            add_event(session, job.id, now, "Checkpoint saved; job paused.")
        return Moved(False, was, f"the job is {was}")
    job.control = "registering"
    return Moved(True, "running")


def run_succeeded(session: Session, job: Job, owner: str, now: int) -> Moved:
    """After registration, in its transaction (the caller locked the job with `owned`)."""
    if job.lease_owner != owner:
        return Moved(False, job.status, "the lease is not the caller's")
    _release(job, now)
    return finish(session, job, "succeeded", now, message="The job has successfully completed.")


def run_refused(session: Session, job: Job, owner: str, now: int, code: str, message: str) -> Moved:
    """Registration refused the trained adapter (a quota, an invalid adapter)."""
    if job.lease_owner != owner:
        return Moved(False, job.status, "the lease is not the caller's")
    _release(job, now)
    return finish(session, job, "failed", now, error=job_error(code, message))


def lose_run(session: Session, job: Job, now: int) -> Moved:
    """The run driving the job is gone (its lease expired, or its driver is known dead). A running
    job is queued again once, to resume from its last checkpoint, then fails `platform_interrupted`;
    a job that had moved on keeps its status and only loses the lease. Caller holds the job's lock."""
    _release(job, now)
    if job.status != "running":
        return Moved(True, job.status)
    job.control, job.estimated_finish = None, None
    if leases.exhausted(RUN, job):
        return finish(session, job, "failed", now, error=job_error(
            RUN.exhausted_code, "The worker running the job was lost and the job is not restarted."))
    job.status, job.updated_at, job.waiting_since = "queued", now, now
    add_event(session, job.id, now, "The run was lost with its worker or controller; the job is queued again "
              "and resumes from its last checkpoint.", level="warn")
    return Moved(True, "queued")


def expire_wait(session: Session, job: Job, now: int, limit_s: float) -> Moved:
    """A job waiting (validating_files or queued, with no run) past the wait limit ends: a job that
    never ran fails `job_unavailable`; one that ran before (requeued or resumed) fails `job_expired`."""
    if job.status not in ("validating_files", "queued") or job.lease_owner is not None:
        return Moved(False, job.status, "the job is not waiting")
    since = job.waiting_since if job.waiting_since is not None else job.created_at
    if now - since < limit_s:
        return Moved(False, job.status, "the wait is within the limit")
    hours = limit_s / 3600
    if job.started_at is None:
        error = job_error("job_unavailable", f"No capacity became free for this job within {hours:g} hours. Nothing ran "
                       "and nothing was charged.")
    else:
        error = job_error("job_expired", f"The job did not finish within its time limit: it waited {hours:g} hours to "
                       "run again without capacity becoming free.")
    return finish(session, job, "failed", now, error=error)
