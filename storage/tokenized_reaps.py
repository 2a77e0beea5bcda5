"""Deleting shared tokenized shards without racing a job that is about to read them.

Shards under `tokenized/{sha256}/` serve every job on a file with those bytes, in any account. The
reaper may delete them only when no such job is open or recently ended, but "check, then delete"
alone races a job created in between, whose controller could load shards as they are deleted.
So each side writes, then reads, which holds on SQLite and under PostgreSQL's READ COMMITTED:
- the reaper commits a mark for the bytes (`mark`), then checks for jobs on them again
  (`shards_in_use`); only if there are none does it delete (manifests first, so a reader of a
  half-deleted prefix tokenizes afresh), and then it removes the mark (`unmark`);
- a job's controller, whose job row was committed before it started, waits while a mark for its
  file's bytes exists (`wait_while_marked`) before it looks for shards.
Either the reaper's second check sees the job and backs off, or the controller sees the mark and
waits until the deletion is over. A mark older than STALE_S (a reaper that died mid-delete) holds
no job back, and the next reaper pass takes it over and finishes the deletion.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from storage.jobs import OPEN_STATUSES
from storage.models import File, Job, TokenizedReap

STALE_S = 600


def shards_in_use(session: Session, sha256: str, cutoff: int) -> bool:
    """Whether a job on a file with these bytes is open or ended after `cutoff`."""
    same_bytes = select(File.id).where(File.sha256 == sha256)
    recent = Job.status.in_(OPEN_STATUSES) | Job.finished_at.is_(None) | (Job.finished_at > cutoff)
    query = select(Job.id).where(recent, or_(Job.training_file.in_(same_bytes), Job.validation_file.in_(same_bytes)))
    return session.scalar(query.limit(1)) is not None


def mark(session: Session, sha256: str, now: int) -> bool:
    """Mark the bytes as being reaped; False if another reaper's fresh mark is already there."""
    row = session.get(TokenizedReap, sha256, with_for_update=True)
    if row is None:
        session.add(TokenizedReap(sha256=sha256, started_at=now))
        return True
    if now - row.started_at < STALE_S:
        return False
    row.started_at = now
    return True


def stale_marks(session: Session, now: int, limit: int) -> list[str]:
    """Bytes whose reaper died mid-delete: the next pass finishes the job."""
    query = select(TokenizedReap.sha256).where(TokenizedReap.started_at <= now - STALE_S).limit(limit)
    return list(session.scalars(query))


def unmark(session: Session, sha256: str) -> None:
    row = session.get(TokenizedReap, sha256)
    if row is not None:
        session.delete(row)


def wait_while_marked(db, sha256: str, *, clock: Callable[[], float] = time.time, poll_s: float = 0.5) -> None:
    """Return once no fresh reaper mark is on these bytes."""
    while True:
        with db.session() as session:
            row = session.get(TokenizedReap, sha256)
            if row is None or clock() - row.started_at >= STALE_S:
                return
        time.sleep(poll_s)
