"""The controller's batch passes: lose batches nothing drives, and claim batches to drive.

Where it sits: train/controller.py calls these every pass, after `jobs.scheduling.start_runs` (a
queued job goes first), and drives each claim on a thread (batches/run.py). Each pass is made of
batches/transitions.py compare-and-sets under the scheduler's lock, like the runs' passes.

- `reconcile`: a batch whose lease lapsed (its driver, controller or node died), or one of this
  controller's whose thread is gone, is lost (`transitions.lose`).
- `claim_batches`: first every batch to close without running (cancelled, or expired while it
  waited: no capacity needed, it only writes its error file), then runnable batches, oldest
  first, while fewer than `max_concurrent_batches` are leased and the cluster has room beside
  the leased runs and batches (`fit(session)`: jobs/scheduling.py's shared rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import or_, select

from batches import transitions
from jobs.transitions import lock_scheduler
from openft.settings import Settings
from storage.batches import count_leased
from storage.db import Database
from storage.models import Batch


@dataclass(frozen=True)
class Claim:
    batch_id: str
    owner: str
    close: str | None  # "cancelled" | "expired": close without running; None: run it


def _lost(batch: Batch, now: int, alive: set[str], mine: str) -> bool:
    if batch.lease_owner is None or batch.lease_owner in alive:
        return False
    return batch.lease_owner.startswith(mine) or (batch.lease_expires_at or 0) < now


def reconcile(db: Database, now: int, *, alive: Iterable[str], mine: str) -> list[str]:
    alive = set(alive)
    with db.session() as session:
        ids = [b.id for b in session.scalars(select(Batch).where(Batch.lease_owner.is_not(None)))
               if _lost(b, now, alive, mine)]
    lost = []
    for batch_id in ids:
        with db.session() as session:
            batch = transitions.lock_batch(session, batch_id)
            if batch is not None and _lost(batch, now, alive, mine):
                transitions.lose(session, batch, now)
                lost.append(batch_id)
    return lost


def claim_batches(db: Database, now: int, *, settings: Settings, fit: Callable[[object], float],
                  new_owner: Callable[[], str]) -> list[Claim]:
    claims: list[Claim] = []
    lease_s = int(settings.run_lease_seconds)
    with db.session() as session:
        lock_scheduler(session)
        # Counted before the closes are leased: closing a batch that never ran takes no capacity.
        room = min(settings.max_concurrent_batches - count_leased(session), fit(session))
        closable = session.scalars(select(Batch).where(
            Batch.lease_owner.is_(None),
            or_(Batch.status == "cancelling",
                Batch.status.in_(transitions.RUNNABLE) & (Batch.expires_at <= now)))
            .order_by(Batch.created_ns)).all()
        for batch in closable:
            close = transitions.close_without_run(batch, now)
            owner = new_owner()
            if close and transitions.claim(session, batch.id, now, owner=owner, lease_s=lease_s).ok:
                claims.append(Claim(batch.id, owner, close))
        if room <= 0:
            return claims
        waiting = session.scalars(select(Batch.id).where(
            Batch.lease_owner.is_(None), Batch.status.in_(transitions.RUNNABLE), Batch.expires_at > now)
            .order_by(Batch.created_ns).limit(int(min(room, 1000)))).all()
        for batch_id in waiting:
            owner = new_owner()
            if transitions.claim(session, batch_id, now, owner=owner, lease_s=lease_s).ok:
                claims.append(Claim(batch_id, owner, None))
    return claims
