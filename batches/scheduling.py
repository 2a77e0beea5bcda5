"""The controller's batch passes: lose batches nothing drives, and claim batches to drive.

Where it sits: the worker's batch pass (worker/batches.py) calls these every pass, after the runs'
(a queued job goes first), and drives each claim on a thread (batches/run.py). Each pass is made of
batches/transitions.py compare-and-sets under the scheduler's lock, like the runs' passes.

- `reconcile`: a batch whose lease lapsed (its driver, controller or node died), or one of this
  controller's whose thread is gone, is lost (storage/leases.py `reconcile`, `transitions.lose`).
- `claim_batches`: first every batch to close without running (cancelled, or expired while it
  waited: no capacity needed, it only writes its error file), then runnable batches, oldest
  first, while fewer than `max_concurrent_batches` batches and eval runs are leased and the cluster has room beside
  the leased runs and batches (`fit(session)`: jobs/scheduling.py's shared rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import or_, select

from batches import transitions
from openft.settings import Settings
from storage import leases
from storage.batches import count_leased
from storage.evals import count_leased_runs
from storage.db import Database
from storage.models import Batch


@dataclass(frozen=True)
class Claim:
    batch_id: str
    owner: str
    close: str | None  # "cancelled" | "expired": close without running; None: run it


def reconcile(db: Database, now: int, *, alive: Iterable[str], mine: str | None) -> list[str]:
    def lose(session, batch: Batch, now: int) -> str:
        transitions.lose(session, batch, now)
        return batch.id

    return leases.reconcile(db, transitions.BATCH, now, alive=alive, mine=mine, lose=lose)


def engine_room(session, settings: Settings) -> int:
    """How many more batches and eval runs `max_concurrent_batches` allows: both run on the batch
    engine, so they count against one cap (evals/scheduling.py claims under it too)."""
    return settings.max_concurrent_batches - count_leased(session) - count_leased_runs(session)


def admitted(waiting, room: int, fit: Callable[[object], float], session) -> list:
    """The first of `waiting` that the cap's `room` and the cluster (`fit`) take. The cluster is
    asked only when something waits: `fit` asks Ray's GCS, the dearest part of an idle pass."""
    return list(waiting[:max(0, int(min(room, fit(session))))]) if waiting else []


def claim_batches(db: Database, now: int, *, settings: Settings, fit: Callable[[object], float],
                  new_owner: Callable[[], str]) -> list[Claim]:
    claims: list[Claim] = []
    lease_s = int(settings.run_lease_seconds)
    with db.session() as session:
        leases.lock_scheduler(session)
        # Counted before the closes are leased: closing a batch that never ran takes no capacity.
        # Eval runs sample on the batch engine: they count against the same cap (evals/scheduling.py).
        room = engine_room(session, settings)
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
        for batch_id in admitted(waiting, room, fit, session):
            owner = new_owner()
            if transitions.claim(session, batch_id, now, owner=owner, lease_s=lease_s).ok:
                claims.append(Claim(batch_id, owner, None))
    return claims
