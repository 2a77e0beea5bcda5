"""One lease and transition mechanism for every kind of background work: fine-tuning runs, distills,
batches, merges and webhook deliveries, and whatever comes next.

Where it sits: in storage/, below every package that owns a kind of work (jobs/, batches/, merge/,
webhooks/ through storage/webhooks.py), which declare their `Kind` and call these functions inside
their own transitions; the worker package (worker/) runs the passes. It knows rows, locks and
time, never a kind's states: what a status means, and what "lost" or "done" does to it, stays
with the kind.

What a lease is: a row's `lease_owner`, a token `<worker id>.<kind's letter><random>` (`new_owner`),
and `lease_expires_at`. Whoever holds it drives the row and renews it (`Heartbeat`, or `renew`);
every write the holder makes proves it first (`owned`: the row under its locks, or None;
`write_owned`: an UPDATE that matches only while the lease is the caller's), so a holder that lost
its lease writes nothing. The holder releases it when the work ends (`release`).

Claiming is a compare-and-set: `claim` locks the row (lock order below), re-reads it, and leases
it only if no one holds it and the kind's own precondition (`ready`) passes; otherwise it returns
`Moved(ok=False, why=...)` and changes nothing. Every transition of every kind answers with the
same `Moved`. Many rows at once without account locks (webhook deliveries): `claim_many`.

Lock order, the same for every kind and every caller so that none can deadlock with another:
the scheduler's row (`lock_scheduler`: passes that count leases against a capacity), then the
account's row (`lock_account`), then the account's rows (`lock_row`: a job, a batch, a merge).
On PostgreSQL these are row locks (SELECT ... FOR UPDATE); on SQLite `BEGIN IMMEDIATE`
(storage/db.py) serialises every writer. Webhook deliveries take only their own rows' locks,
and nothing holding one asks for an account's lock.

Losing: a lease that expired (its holder, its process or its node died), a lease of this worker
whose thread is gone (`mine` and not `alive`), or a row in a status that needs a lease with none
(`Kind.needs_lease`) is lost. `reconcile` finds them, re-checks each under its locks and hands it
to the kind's `lose`, which requeues it or, once `exhausted` (the attempt rule: `Kind.max_attempts`
leases taken, counted in `Kind.attempts`), fails it with `Kind.exhausted_code`. Work that Ray
lost under its holder (`lost_by_ray`) records no end: its thread ends, and the next pass loses it.

Adding a kind of background work (an eval run, a reinforcement job):
1. its table gets `id`, `account_id`, `status`, `lease_owner`, `lease_expires_at` and an attempts
   column (a migration);
2. its package declares the kind, as data, e.g.
       EVAL = Kind("eval", EvalRun, "e", max_attempts=2, exhausted_code="eval_interrupted",
                   needs_lease=EvalRun.status == "running", pending=EvalRun.status == "queued")
   (`pending`: every status with no lease that its claim pass acts on; the controller passes over
   a kind with no such row and none leased, `due_kinds`)
3. its transitions module writes its own states: a claim (`claim` with its `ready`, then its own
   status change), `lose(session, row, now)` (`release`, then requeue, or fail with
   `exhausted_code` once `exhausted`), and its ends, each starting with `owned` and calling
   `release` (a holder that finds the row not its own raises `LeaseLost` and writes nothing);
4. a module in worker/ implements the pass (worker/work.py `Work`: `reconcile` with its `lose`,
   `claim` returning a task per claim that drives it under a `Heartbeat`) and is added to the
   controller's list (worker/controller.py `Controller.work`).
Nothing else: the heartbeat, reconciliation, owner tokens and the lock order are these.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, exists, false, or_, select, update
from sqlalchemy.orm import Session

from storage.db import Database
from storage.models import Account, SchedulerLock

log = logging.getLogger("openft.leases")


@dataclass(frozen=True)
class Moved:
    """What a transition did: `ok` when it changed the row; `status` is the row's status after the
    call (None: no such row, or the lease is not the caller's); `why` says why nothing changed."""

    ok: bool
    status: str | None
    why: str = ""


NOT_OWNED = Moved(False, None, "the lease is not the caller's")


class LeaseLost(Exception):
    """Another worker holds the row now (or none: it ended): the work stops and writes nothing."""


@dataclass(frozen=True)
class Kind:
    """A kind of background work, as data."""

    name: str  # "run", "distill", "batch", "merge", "delivery"
    model: type  # its ORM class: id, status, lease_owner, lease_expires_at and `attempts`
    token: str  # the letter after the worker id in its owner tokens: whose lease a row holds, at a glance
    max_attempts: int | None  # leases that may be taken before a lost one is failed (None: no such limit)
    exhausted_code: str | None  # the code the kind fails with once a lost row has no attempt left
    attempts: str = "attempts"  # the column counting the leases taken (a claim adds one)
    scope: ColumnElement | None = None  # which of the model's rows this kind leases (a table shared by two kinds)
    needs_lease: ColumnElement | None = None  # statuses in which a row with no lease is lost (nothing drives it)
    pending: ColumnElement | None = None  # statuses in which a row with no lease waits on the kind's claim pass

    def held(self) -> ColumnElement:
        """Rows of this kind a lease holds."""
        leased = self.model.lease_owner.is_not(None)
        return leased if self.scope is None else leased & self.scope

    def candidates(self) -> ColumnElement:
        """Rows `reconcile` looks at: leased ones, and those in a status that needs a lease."""
        orphaned = false() if self.needs_lease is None else self.model.lease_owner.is_(None) & self.needs_lease
        return or_(self.held(), orphaned)

    def due(self) -> ColumnElement:
        """Rows a pass of this kind could act on: `candidates()`, and rows with no lease that its
        claim pass looks at (`pending`: queued, cancelling, waiting past a limit)."""
        waiting = false() if self.pending is None else self.model.lease_owner.is_(None) & self.pending
        return or_(self.candidates(), waiting)


def due_kinds(session: Session, kinds: Iterable[Kind]) -> set[str]:
    """The names of the `kinds` with a row that a pass could act on (`Kind.due`), in one query. A kind
    with none has nothing to reconcile or claim: its pass, a dozen statements and the scheduler's
    lock (a write on SQLite), would change nothing."""
    kinds = list(kinds)
    found = session.execute(select(*(exists().where(kind.due()).label(kind.name) for kind in kinds))).one()
    return {kind.name for kind, hit in zip(kinds, found) if hit}


def new_owner(worker_id: str, kind: Kind) -> str:
    """A lease token of `worker_id` for one piece of `kind`'s work (unique per claim)."""
    return f"{worker_id}.{kind.token}{uuid.uuid4().hex[:12]}"


# -- locks, in their order --------------------------------------------------------------------------
def lock_scheduler(session: Session) -> None:
    """First in the lock order: passes that count leases against a capacity take it."""
    with session.no_autoflush:
        session.execute(select(SchedulerLock.id).where(SchedulerLock.id == 1).with_for_update())


def lock_account(session: Session, account_id: str) -> None:
    """The account's row: taken before any row of the account is locked or changed."""
    # Pending changes must not be flushed (and their rows locked) before the account's lock.
    with session.no_autoflush:
        session.execute(select(Account.id).where(Account.id == account_id).with_for_update())


def lock_row(session: Session, model, row_id: str, account_id: str | None = None):
    """A row of `model` under its account's lock, then its own: the read a compare-and-set decides
    on. `account_id` scopes the lookup to one account (the API); None finds any account's row."""
    query = select(model.account_id).where(model.id == row_id)
    if account_id is not None:
        query = query.where(model.account_id == account_id)
    owner = session.scalar(query)
    if owner is None:
        return None
    lock_account(session, owner)
    # populate_existing: a copy of the row read before the lock is refreshed, not trusted.
    return session.scalar(
        select(model).where(model.id == row_id).with_for_update().execution_options(populate_existing=True))


# -- claim, renew, prove, release -----------------------------------------------------------------
def take(kind: Kind, row, owner: str, now: float, lease_s: float) -> None:
    """Lease a row the caller locked and checked, counting an attempt."""
    row.lease_owner, row.lease_expires_at = owner, now + lease_s
    setattr(row, kind.attempts, (getattr(row, kind.attempts) or 0) + 1)


def claim(session: Session, kind: Kind, row_id: str, owner: str, now: float, lease_s: float,
          ready: Callable[[Any], str | None] = lambda row: None) -> Moved:
    """Compare-and-set: lease the row to `owner` if no one holds it and `ready(row)` (the kind's
    precondition, read under the locks) gives no reason not to."""
    row = lock_row(session, kind.model, row_id)
    if row is None:
        return Moved(False, None, "no such row")
    if row.lease_owner is not None:
        return Moved(False, row.status, "a worker holds it")
    why = ready(row)
    if why:
        return Moved(False, row.status, why)
    take(kind, row, owner, now, lease_s)
    return Moved(True, row.status)


def claimable(kind: Kind, now: float) -> ColumnElement:
    """No lease, or one that lapsed: for a kind whose loss changes nothing but the holder (a
    delivery is simply tried again), a lapsed lease is taken over at the claim, with no reconcile."""
    model = kind.model
    return model.lease_owner.is_(None) | (model.lease_expires_at < now)


def claim_many(session: Session, kind: Kind, where: ColumnElement, order_by: Iterable, limit: int, owner: str,
               now: float, lease_s: float) -> list[str]:
    """Lease up to `limit` rows matching `where` (which must include `claimable`); returns their ids.
    Compare-and-set row by row: the UPDATE repeats `where`, so of two workers racing for a row one
    updates it and the other's UPDATE (on PostgreSQL it waits for the first's commit, then re-reads
    the row) matches nothing; SKIP LOCKED lets the second pick other rows meanwhile."""
    model = kind.model
    ids = session.scalars(select(model.id).where(where).order_by(*order_by).limit(limit)
                          .with_for_update(skip_locked=True)).all()
    count = getattr(model, kind.attempts)
    claimed = []
    for row_id in ids:
        done = session.execute(update(model).where(model.id == row_id, where).values(
            {model.lease_owner: owner, model.lease_expires_at: now + lease_s, count: count + 1}))
        if done.rowcount == 1:
            claimed.append(row_id)
    return claimed


def read_held(db: Database, model, row_id: str, owner: str):
    """The row, detached, for a holder to read from (a driver's start): LeaseLost when it is not `owner`'s."""
    with db.session() as session:
        row = session.get(model, row_id)
        if row is None or row.lease_owner != owner:
            raise LeaseLost()
        session.expunge(row)
        return row


def write_owned(session: Session, model, row_id: str, owner: str, *also: ColumnElement, **values) -> bool:
    """Write `values` to the row only while `owner` holds its lease (and `also` holds); whether it did."""
    done = session.execute(update(model).where(model.id == row_id, model.lease_owner == owner, *also).values(**values))
    return done.rowcount == 1


RELEASED = {"lease_owner": None, "lease_expires_at": None}  # `release` as `write_owned` values


def renew(session: Session, kind: Kind, row_id: str, owner: str, now: float, lease_s: float) -> bool:
    """Extend `owner`'s lease; False once it no longer holds it (stop, and write nothing)."""
    return write_owned(session, kind.model, row_id, owner, lease_expires_at=now + lease_s)


def owned(session: Session, model, row_id: str, owner: str):
    """The row under its locks while `owner` holds its lease, else None: every write of a holder starts here."""
    row = lock_row(session, model, row_id)
    return row if row is not None and row.lease_owner == owner else None


def release(row) -> None:
    """The holder's work on the row ended (or was lost): no one holds it now."""
    row.lease_owner = row.lease_expires_at = None


def exhausted(kind: Kind, row) -> bool:
    """The attempt rule: a lost row with this many leases taken is failed, not requeued."""
    return kind.max_attempts is not None and (getattr(row, kind.attempts) or 0) >= kind.max_attempts


def drive(kind: Kind, row_id: str, work: Callable[[], None], fail: Callable[[], None]) -> None:
    """A holder's `work` on a row, the same way for every kind's driver: a lease found lost stops it
    quietly (another worker holds the row, or it ended); any other failure is logged by its class
    only (never its message, which may quote users' data) and recorded by `fail` (the kind's end as
    failed, retried by the caller), unless Ray lost it (`lost_by_ray`); an end that cannot be
    recorded, and work Ray lost, are left to `reconcile`, which requeues them once the thread
    has ended (or the lease lapsed)."""
    try:
        work()
    except LeaseLost:
        log.info("%s %s: its lease is held by another worker; stopped", kind.name, row_id)
    except Exception as exc:
        if lost_by_ray(exc):
            # Not the work's failure: reconciliation requeues it (an attempt more, `exhausted_code` at the cap).
            log.warning("%s %s: Ray lost a process it ran on (%s); it runs again", kind.name, row_id,
                        type(exc).__name__)
            return
        log.error("%s %s failed: %s", kind.name, row_id, type(exc).__name__)
        try:
            fail()
        except Exception as again:  # the lease lapses and reconciliation takes the row
            log.error("%s %s could not record its end: %s", kind.name, row_id, type(again).__name__)


def lost_by_ray(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, is Ray losing a process
    or node the work ran on (a task's worker or node died, an actor, an object or the local raylet
    was lost, a worker was killed for memory), not the work's own code raising, a timeout, or a
    cancel. A dying service does this to its own work first: its Ray node goes while the worker's
    threads still run (tests/faults), and a failure they recorded then would outlive the restart
    that runs it again."""
    errors = sys.modules.get("ray.exceptions")
    if errors is None:  # Ray was never imported here: nothing raised can be Ray's
        return False
    lost = (errors.WorkerCrashedError, errors.NodeDiedError, errors.LocalRayletDiedError, errors.RayActorError,
            errors.ObjectLostError, errors.RaySystemError, errors.OutOfMemoryError, errors.RpcError,
            errors.TaskPlacementGroupRemoved, errors.ActorPlacementGroupRemoved)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, lost):
            return True
        if isinstance(exc, errors.RayTaskError):  # a task's code raised: what it raised counts
            exc = exc.cause
        else:  # raised from it, or while handling it (a cleanup that met the same dying Ray)
            exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


# -- the lost -----------------------------------------------------------------------------------------
def is_lost(row, now: float, alive: set[str], mine: str | None) -> bool:
    """Nothing drives a row of `Kind.candidates()`: it has no lease (it is in a status that needs
    one), or its lease expired, or it is this worker's (`mine`, the prefix of its tokens) and its
    thread is not `alive`."""
    if row.lease_owner is None:
        return True
    if row.lease_owner in alive:
        return False
    return (mine is not None and row.lease_owner.startswith(mine)) or (row.lease_expires_at or 0) < now


def reconcile(db: Database, kind: Kind, now: float, *, alive: Iterable[str], mine: str | None,
              lose: Callable[[Session, Any, float], Any]) -> list:
    """Hand every lost row of `kind` to `lose(session, row, now)` (its locks held, in a transaction
    of its own) and return what each call returned. `alive`: the tokens of this worker's live
    threads; `mine`: the prefix of this worker's tokens (None: only expired leases are lost)."""
    alive = set(alive)
    model = kind.model
    with db.session() as session:
        ids = [row.id for row in session.scalars(select(model).where(kind.candidates()))
               if is_lost(row, now, alive, mine)]
    out = []
    for row_id in ids:
        with db.session() as session:
            row = lock_row(session, model, row_id)
            # Re-checked under the locks: the row may have ended, or been claimed, meanwhile.
            still = row is not None and session.scalar(select(model.id).where(model.id == row_id, kind.candidates()))
            if still and is_lost(row, now, alive, mine):
                out.append(lose(session, row, now))
    return out


# -- the heartbeat ------------------------------------------------------------------------------------
class Heartbeat:
    """Renews one lease every third of its length on a thread of its own, for as long as its work
    runs. A renewal that finds the lease gone sets `lost` (the work stops and writes nothing); one
    that fails on the database is retried at the next beat (an outage shorter than the lease is
    ridden through). `read(session)`, called in each renewal's transaction, keeps `seen` current
    (what the work polls: a batch's status, a run's progress). A set `stopping` (the worker is
    shutting down) stops renewing, so the lease lapses and the next worker takes the row."""

    def __init__(self, db: Database, kind: Kind, row_id: str, owner: str, lease_s: float, *,
                 read: Callable[[Session], Any] | None = None, stopping: threading.Event | None = None,
                 every: float | None = None):
        self.db, self.kind, self.row_id, self.owner, self.lease_s = db, kind, row_id, owner, lease_s
        self.read, self.stopping = read, stopping or threading.Event()
        self.every = every if every is not None else max(lease_s / 3, 0.2)
        self.lost = threading.Event()
        self.seen: Any = None
        self.renewed_at = time.time()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{kind.name}-beat-{row_id}", daemon=True)

    def beat(self) -> bool:
        """One renewal (raises the database's error); whether the lease is still held."""
        with self.db.session() as session:
            if not renew(session, self.kind, self.row_id, self.owner, time.time(), self.lease_s):
                self.lost.set()
                return False
            if self.read is not None:
                self.seen = self.read(session)
        self.renewed_at = time.time()
        return True

    def _loop(self) -> None:
        while not self._done.wait(self.every) and not self.stopping.is_set():
            try:
                if not self.beat():
                    return
            except Exception as exc:  # the database is down: renew when it is back
                log.warning("%s %s: lease renewal failed: %s", self.kind.name, self.row_id, type(exc).__name__)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def holding(self) -> bool:
        """Whether the work should go on: the lease was not lost and the worker is not stopping."""
        return not self.lost.is_set() and not self.stopping.is_set()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
