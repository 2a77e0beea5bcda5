"""Every change of a batch's status, and the lease that decides who drives a batch.

Where it sits: the API's service (create, cancel) and the controller's batch passes
(batches/scheduling.py, batches/run.py) call these inside their own transaction; nothing else
writes `Batch.status`. Compare-and-set on storage/leases.py, as every kind of background work: each
function takes the account's lock, then the batch row's, re-reads the row, checks the status (and,
for a driver, that it still holds the lease) and changes nothing when the row has moved on,
returning `Moved(ok=False, ...)`. `BATCH` is the kind: its lease, its attempts, its code.

Statuses (OpenAI's), each with its timestamp:
- `validating`: created (the create-time scan passed); waits for capacity.
- `in_progress` (`in_progress_at`): a controller holds the lease, staged the adapters and runs it.
- `finalizing` (`finalizing_at`): every line ran; the output and error files are being recorded.
- `completed` (`completed_at`), `expired` (`expired_at`: the completion window passed; finished
  lines are kept), `cancelled` (`cancelled_at`), `failed` (`failed_at`: it could not run, e.g. the
  account's credit could not fund it).
- `cancelling` (`cancelling_at`): a cancel arrived; the driver sees it within seconds (its
  `should_stop` reads it), keeps what finished and ends `cancelled`. A batch cancelled or expired
  before it ran is closed by the controller too, which writes every line to the error file
  (`batch_cancelled` / `batch_expired`): every custom_id is accounted for once.

A lease that lapses (its controller died) is a lost driver: `lose` leaves an `in_progress` batch
to be claimed and run again from the start once (its files are written atomically at the end, so
nothing half-made is seen), then fails it `batch_interrupted`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from batches import billing
from storage import leases
from storage.batches import ENDED_STATUSES
from storage.leases import Kind, Moved
from storage.models import Batch
from webhooks import events, outbox

RUNNABLE = ("validating", "in_progress")  # what a driver may claim to run (in_progress: its driver was lost)
# A batch's driver: run from the start once more after a lost one, then `batch_interrupted`. A
# finalizing batch with no lease lost its driver between its last line and its files.
BATCH = Kind("batch", Batch, "b", max_attempts=2, exhausted_code="batch_interrupted",
             needs_lease=Batch.status == "finalizing", pending=Batch.status.in_(("cancelling", *RUNNABLE)))


def batch_error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def lock_batch(session: Session, batch_id: str, account_id: str | None = None) -> Batch | None:
    """The batch's row under the account's lock, then its own (the read a compare-and-set decides on)."""
    return leases.lock_row(session, Batch, batch_id, account_id)


def add_new(session: Session, batch: Batch, now: int, window_s: float) -> None:
    """Insert a batch create built (the caller holds the account's lock and checked the limits)."""
    batch.status, batch.updated_at = "validating", now
    batch.expires_at = now + int(window_s)
    session.add(batch)
    session.flush()


def close_without_run(batch: Batch, now: int) -> str | None:
    """What a batch no driver holds ends as without running (`cancelled`, `expired`), or None (it may run).
    The controller closes it writing every line to the error file; a cancelled batch whose driver
    was lost is closed this way too (the lost run's lines were never recorded)."""
    if batch.lease_owner is not None:
        return None
    if batch.status == "cancelling":
        return "cancelled"
    if batch.status in RUNNABLE and now >= batch.expires_at:
        return "expired"
    return None


# -- the API's request --------------------------------------------------------------------------
def cancel(session: Session, batch: Batch, now: int) -> Moved:
    """`validating` or `in_progress` → `cancelling`; a cancelling batch is left as it is (the
    request is answered, not refused). The driver (or, for a batch that never ran, the controller's
    close) ends it `cancelled`."""
    if batch.status == "cancelling":
        return Moved(True, "cancelling")
    if batch.status not in RUNNABLE:
        return Moved(False, batch.status, f"it is {batch.status}")
    batch.status, batch.cancelling_at, batch.updated_at = "cancelling", now, now
    return Moved(True, "cancelling")


# -- the driver: claim, start, renew, progress, end ----------------------------------------------
def claim(session: Session, batch_id: str, now: int, *, owner: str, lease_s: int) -> Moved:
    """Lease a batch no one drives: one to run (`validating`, or `in_progress` after a lost
    driver), or one to close that never ran (cancelled or expired while it waited)."""

    def ready(batch: Batch) -> str | None:
        runs_or_closes = batch.status in RUNNABLE or close_without_run(batch, now) is not None
        return None if runs_or_closes else f"it is {batch.status}"

    moved = leases.claim(session, BATCH, batch_id, owner, now, lease_s, ready)
    if moved.ok:
        session.get(Batch, batch_id).updated_at = now
    return moved


def owned(session: Session, batch_id: str, owner: str) -> Batch | None:
    return leases.owned(session, Batch, batch_id, owner)


def begin(session: Session, batch_id: str, owner: str, now: int, *, billing_enabled: bool,
          quote: dict | None) -> Moved:
    """`validating` → `in_progress` (a rerun after a lost driver stays `in_progress`). Billing on:
    the quote's most is held first; a batch the account's credit cannot fund fails
    `insufficient_quota` before anything runs."""
    batch = owned(session, batch_id, owner)
    if batch is None:
        return leases.NOT_OWNED
    if batch.status not in RUNNABLE:
        return Moved(False, batch.status, f"it is {batch.status}")
    if billing_enabled and quote is not None:
        batch.quote = quote
        if not billing.hold(session, batch, now):
            message = billing.shortfall_message(session, batch)
            _end(batch, "failed", now, errors=[batch_error("insufficient_quota", message)])
            billing.settle(session, batch, now)
            return Moved(False, "failed", "insufficient_quota")
    if batch.status == "validating":
        batch.status, batch.in_progress_at = "in_progress", now
    batch.updated_at = now
    return Moved(True, batch.status)


@dataclass(frozen=True)
class Seen:
    """What a driver's heartbeat read: the batch's status and when it expires."""

    status: str
    expires_at: int

    def stop_reason(self, now: float) -> str | None:
        if self.status == "cancelling":
            return "cancelled"
        if now >= self.expires_at:
            return "expired"
        return None


def seen(session: Session, batch_id: str) -> Seen:
    """What the driver's heartbeat reads beside its renewal."""
    status, expires_at = session.execute(select(Batch.status, Batch.expires_at).where(Batch.id == batch_id)).one()
    return Seen(status, expires_at)


def progress(session: Session, batch_id: str, owner: str, *, total: int, completed: int, failed: int) -> bool:
    return leases.write_owned(session, Batch, batch_id, owner,
                              request_counts={"total": total, "completed": completed, "failed": failed})


def begin_finalizing(session: Session, batch_id: str, owner: str, now: int) -> Moved:
    """Every line ran: `in_progress` → `finalizing` (a cancelling batch stays cancelling: it ends cancelled)."""
    batch = owned(session, batch_id, owner)
    if batch is None:
        return leases.NOT_OWNED
    if batch.status == "in_progress":
        batch.status, batch.finalizing_at, batch.updated_at = "finalizing", now, now
    return Moved(True, batch.status)


def end_status(batch: Batch, stopped: str | None) -> str:
    """A cancel stands once requested; else the run's own stop (expired), else completed."""
    if batch.status == "cancelling" or stopped == "cancelled":
        return "cancelled"
    return "expired" if stopped == "expired" else "completed"


def finish(session: Session, batch_id: str, owner: str, now: int, *, stopped: str | None, counts: dict,
           output_file_id: str | None, error_file_id: str | None, usage: dict | None,
           billed_tokens: int = 0) -> Moved:
    """The driver's end: completed, expired or cancelled, with the counts, the files, the usage and
    (billing) the charge of the real tokens, never more than the hold; the lease is released."""
    batch = owned(session, batch_id, owner)
    if batch is None:
        return leases.NOT_OWNED
    if batch.status in ENDED_STATUSES:
        return Moved(False, batch.status, f"it is {batch.status}")
    status = end_status(batch, stopped)
    batch.request_counts, batch.usage = counts, usage
    batch.output_file_id, batch.error_file_id = output_file_id, error_file_id
    _end(batch, status, now)
    billing.settle(session, batch, now, tokens=billed_tokens)
    return Moved(True, status)


def fail(session: Session, batch_id: str, owner: str, now: int, code: str, message: str) -> Moved:
    """The driver could not run the batch (a platform failure): `failed`, nothing charged."""
    batch = owned(session, batch_id, owner)
    if batch is None:
        return leases.NOT_OWNED
    if batch.status in ENDED_STATUSES:
        return Moved(False, batch.status, f"it is {batch.status}")
    _end(batch, "failed", now, errors=[batch_error(code, message)])
    billing.settle(session, batch, now, tokens=0)
    return Moved(True, "failed")


def _end(batch: Batch, status: str, now: int, *, errors: list[dict] | None = None) -> None:
    batch.status, batch.updated_at = status, now
    setattr(batch, f"{status}_at", now)
    if status == "cancelled" and batch.cancelling_at is None:
        batch.cancelling_at = now
    if errors is not None:
        batch.errors = errors
    leases.release(batch)
    # Every end passes here, in its caller's transaction (the batch is that session's row): its webhooks with it.
    outbox.enqueue(object_session(batch), batch.account_id, events.BATCH_EVENTS[status], batch.id, now)


def lose(session: Session, batch: Batch, now: int) -> Moved:
    """Its driver is gone (the lease lapsed). A batch that was running is claimed again and run from
    the start once, then fails `batch_interrupted`; a cancelling one is closed by the next driver.
    The caller holds the batch's lock."""
    leases.release(batch)
    batch.updated_at = now
    if batch.status == "finalizing":
        batch.status = "in_progress"  # its files were not recorded: the rerun makes them again
    if batch.status == "in_progress" and leases.exhausted(BATCH, batch):
        _end(batch, "failed", now, errors=[batch_error(
            BATCH.exhausted_code, "The worker running the batch was lost twice; the batch is not run again. Nothing "
            "was charged: create it again.")])
        billing.settle(session, batch, now, tokens=0)
        return Moved(True, "failed")
    return Moved(True, batch.status)
