"""Job status transitions, shared by the API and the job controller.

Each function runs inside the caller's transaction, changes one job and writes the event that
says so, so a job's status and its events never disagree. An account trains one job at a time:
a `queued`, `running` or `paused` job holds the account's slot; later jobs wait in
`validating_files` with a `waiting_for_capacity` event until it is free.

Who holds the slot is decided under the account row's lock, so two transactions never both see
the slot free. Lock order: the account's row first (`lock_account`; job create takes it too), then
its jobs' rows, so a transaction that ends or resumes several jobs cannot deadlock with the API.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.billing import settle
from storage.jobs import ENDED_STATUSES, add_event
from storage.models import Account, Job

SLOT_STATUSES = ("queued", "running", "paused")
WAITING_REASON = "account_capacity"


def holds_slot(session: Session, account_id: str, *, except_job: str | None = None) -> bool:
    holding = Job.status.in_(SLOT_STATUSES) & ~((Job.status == "paused") & (Job.paused_from == "validating_files"))
    query = select(Job.id).where(Job.account_id == account_id, holding)
    if except_job:
        query = query.where(Job.id != except_job)
    return session.scalar(query.limit(1)) is not None


def lock_account(session: Session, account_id: str) -> None:
    """Take the account row's lock before any job row of the account is locked or changed."""
    # Pending job changes must not be flushed (and their rows locked) before the account's lock.
    with session.no_autoflush:
        session.execute(select(Account.id).where(Account.id == account_id).with_for_update())


def admit(session: Session, job: Job, now: int) -> None:
    """After create: queue the job, or let it wait for the account's slot."""
    lock_account(session, job.account_id)
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
    job.updated_at = now


def promote_waiting(session: Session, account_id: str, now: int) -> Job | None:
    """When the account's slot frees, queue its oldest waiting job."""
    lock_account(session, account_id)
    if holds_slot(session, account_id):
        return None
    job = session.scalar(
        select(Job)
        .where(Job.account_id == account_id, Job.status == "validating_files")
        .order_by(Job.created_ns.asc())
        .limit(1)
    )
    if job is not None:
        job.status, job.reason, job.updated_at = "queued", None, now
        add_event(session, job.id, now, "Capacity available: job queued.")
    return job


def finish(
    session: Session, job: Job, status: str, now: int, *, error: dict | None = None, message: str | None = None
) -> None:
    """End a job (succeeded, failed, cancelled) and hand the account's slot on."""
    assert status in ENDED_STATUSES
    lock_account(session, job.account_id)
    job.status, job.finished_at, job.updated_at, job.reason = status, now, now, None
    job.estimated_finish = None
    if error is not None:
        job.error = error
        add_event(session, job.id, now, f"{error['code']}: {error['message']}", level="error",
                  data={"code": error["code"]})
    elif message:
        add_event(session, job.id, now, message)
    settle(session, job, now)  # the charge commits with the end status, once
    session.flush()
    promote_waiting(session, job.account_id, now)
