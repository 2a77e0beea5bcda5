"""Job and event repository."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from openft.ids import event_id
from storage import leases, paging
from storage.models import FineTunedModel, Job, JobEvent

OPEN_STATUSES = ("validating_files", "queued", "running", "paused")
ENDED_STATUSES = ("succeeded", "failed", "cancelled")
# OpenAI's event levels (the SDK's FineTuningJobEvent.level): any other would make the events list answer 500.
EVENT_LEVELS = ("info", "warn", "error")


def file_in_running_job(session: Session, file_id: str) -> bool:
    """Open jobs (not only `running` ones) hold their files: a queued job must still find them."""
    query = select(func.count()).select_from(Job).where(
        Job.status.in_(OPEN_STATUSES), or_(Job.training_file == file_id, Job.validation_file == file_id)
    )
    return session.scalar(query) > 0


def count_open_jobs(session: Session, account_id: str, *, except_job: str | None = None) -> int:
    query = select(func.count()).select_from(Job).where(Job.account_id == account_id, Job.status.in_(OPEN_STATUSES))
    if except_job is not None:
        query = query.where(Job.id != except_job)
    return session.scalar(query)


def get_job(session: Session, account_id: str, job_id: str, *, for_update: bool = False) -> Job | None:
    query = select(Job).where(Job.id == job_id, Job.account_id == account_id)
    if for_update:
        query = query.with_for_update()
    return session.scalar(query)


def list_jobs(
    session: Session, account_id: str, *, limit: int, after: str | None, metadata: dict[str, str]
) -> tuple[Sequence[Job], bool]:
    """Newest first; `after` is the id of the last job of the previous page."""
    cursor = get_job(session, account_id, after) if after else None
    query = paging.after(select(Job).where(Job.account_id == account_id), Job, cursor)
    if not metadata:
        return paging.first(session, query, limit)
    # JSON containment differs across SQLite and PostgreSQL; metadata is at most 16 short pairs,
    # so filter in Python over the account's jobs in pages.
    out: list[Job] = []
    for job in session.scalars(query).yield_per(200):
        if all((job.job_metadata or {}).get(k) == v for k, v in metadata.items()):
            out.append(job)
            if len(out) > limit:
                break
    return out[:limit], len(out) > limit


def add_event(
    session: Session, job_id: str, now: int, message: str, *, level: str = "info", type: str = "message",
    data: dict | None = None,
) -> JobEvent:
    if level not in EVENT_LEVELS:
        raise ValueError(f"event level {level!r} is not one of {EVENT_LEVELS}")
    event = JobEvent(id=event_id(), job_id=job_id, created_at=now, level=level, message=message, type=type, data=data)
    session.add(event)
    session.flush()
    return event


def list_events(session: Session, job_id: str, *, limit: int, after: str | None) -> tuple[Sequence[JobEvent], bool]:
    """Newest first, like OpenAI's; `after` is the id of the last event of the previous page."""
    query = select(JobEvent).where(JobEvent.job_id == job_id)
    if after:
        cursor_seq = session.scalar(select(JobEvent.seq).where(JobEvent.id == after, JobEvent.job_id == job_id))
        if cursor_seq is not None:
            query = query.where(JobEvent.seq < cursor_seq)
    return paging.first(session, query.order_by(JobEvent.seq.desc()), limit)  # keyed by seq alone: it is unique


def count_by_status(session: Session) -> dict[str, int]:
    """Jobs per status, every status present (0 where none), for the `openft_jobs` gauge."""
    counts = dict.fromkeys((*OPEN_STATUSES, *ENDED_STATUSES), 0)
    counts.update(session.execute(select(Job.status, func.count()).group_by(Job.status)).tuples().all())
    return counts


def first_step_seconds(session: Session, job_id: str) -> float | None:
    """Seconds from the current run's start to its first metrics event (None before either)."""
    job = session.get(Job, job_id)
    if job is None or job.run_started_at is None:
        return None
    first = session.scalar(select(func.min(JobEvent.created_at)).where(
        JobEvent.job_id == job_id, JobEvent.type == "metrics", JobEvent.created_at >= job.run_started_at))
    return None if first is None else float(first - job.run_started_at)


# -- what a run writes and its supervisor reads ------------------------------------------------------
def touch_progress(session: Session, job_id: str, now: int) -> None:
    """The run wrote something: the stall watchdog counts from here."""
    session.execute(update(Job).where(Job.id == job_id).values(progress_at=now))


def record_placement_group(session: Session, job_id: str, owner: str, pg_hex: str) -> bool:
    """The run's Train placement group, recorded only while `owner` holds the job's lease."""
    return leases.write_owned(session, Job, job_id, owner, run_placement_group=pg_hex)


def placement_group(session: Session, job_id: str, owner: str) -> str | None:
    """The placement group `owner`'s run recorded (None once the lease is another's)."""
    return session.scalar(select(Job.run_placement_group).where(Job.id == job_id, Job.lease_owner == owner))


def new_events(session: Session, job_id: str, after_seq: int, type: str) -> Sequence[JobEvent]:
    """The job's events of `type` after `after_seq`, oldest first (a forwarder tailing them)."""
    return session.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after_seq,
                                                  JobEvent.type == type).order_by(JobEvent.seq)).all()


# -- retention (serve_app/services/retention.py) ------------------------------------------------------
def ended_with_copies(session: Session, cutoff: int, *, limit: int) -> Sequence[Job]:
    """Jobs that ended at or before `cutoff` whose run copies are not deleted yet, oldest end first."""
    return session.scalars(select(Job).where(
        Job.finished_at.is_not(None), Job.finished_at <= cutoff, Job.copies_deleted_at.is_(None)
    ).order_by(Job.finished_at).limit(limit)).all()


def live_adapters(session: Session, job_ids: list[str]) -> dict[str, str]:
    """Job id -> adapter prefix of those jobs' models that are not deleted."""
    return dict(session.execute(select(FineTunedModel.job_id, FineTunedModel.adapter_prefix).where(
        FineTunedModel.job_id.in_(job_ids), FineTunedModel.deleted_at.is_(None))).all())


def delete_ended_before(session: Session, cutoff: int, *, limit: int) -> tuple[list[str], int]:
    """Delete up to `limit` jobs that ended at or before `cutoff` (their copies already deleted),
    with their events; (their ids, how many events)."""
    ids = list(session.scalars(select(Job.id).where(
        Job.finished_at.is_not(None), Job.finished_at <= cutoff, Job.copies_deleted_at.is_not(None)).limit(limit)))
    if not ids:
        return [], 0
    events = session.execute(delete(JobEvent).where(JobEvent.job_id.in_(ids))).rowcount
    session.execute(delete(Job).where(Job.id.in_(ids)))
    return ids, events
