"""Every change of an eval run's status, and the lease that decides who drives a run.

Where it sits: the API's service (create, cancel) and the controller's passes (evals/scheduling.py,
evals/run.py) call these inside their own transaction; nothing else writes `EvalRun.status`.
Compare-and-set on storage/leases.py like every kind of background work: each takes the account's
lock, then the run's, re-reads it, checks its status (and, for a driver, that it holds the lease)
and changes nothing when the row has moved on, answering `Moved(ok=False, ...)`.

Statuses (OpenAI's): `queued` (created; waits for capacity), `in_progress` (a driver holds the
lease: it samples, grades and records items), then `completed`, `failed` (`error`: a platform
failure, the credit, or a driver lost twice) or `canceled`. A cancel ends the run at once (its
webhook goes then); a driver that holds it sees that within a second, records what it finished
(finished items are kept), charges for it and lets go. A driver that is lost (its lease lapsed)
requeues an `in_progress` run to be claimed again once, which grades only the items not yet
recorded; then it fails `eval_run_interrupted`. Billing on: the quote's most (batches/billing.py,
at the batch rate) is held at begin and settled at the end, as a batch's.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from batches import billing
from storage import leases
from storage.evals import RUN_ENDED
from storage.leases import Kind, Moved
from storage.billing import credit, to_usd
from storage.models import EvalOutputItem, EvalRun
from webhooks import events, outbox

EVAL_RUN = Kind("eval_run", EvalRun, "e", max_attempts=2, exhausted_code="eval_run_interrupted",
                needs_lease=EvalRun.status == "in_progress", pending=EvalRun.status == "queued")


def add_new(session: Session, run: EvalRun, now: int) -> None:
    run.status, run.updated_at = "queued", now
    session.add(run)
    session.flush()


def lock_run(session: Session, run_id: str, account_id: str | None = None) -> EvalRun | None:
    return leases.lock_row(session, EvalRun, run_id, account_id)


# -- the API's requests ---------------------------------------------------------------------------
def cancel(session: Session, run: EvalRun, now: int) -> Moved:
    """`queued` or `in_progress` → `canceled` (the caller holds the run's lock); an ended run is
    left as it is. A driver holding it stops within a second and records what it finished."""
    if run.status in RUN_ENDED:
        return Moved(False, run.status, f"it is {run.status}")
    _end(session, run, "canceled", now, keep_lease=True)
    if run.lease_owner is None:
        billing.settle(session, run, now, tokens=0)
    return Moved(True, "canceled")


# -- the driver: claim, begin, record, end --------------------------------------------------------
def claim(session: Session, run_id: str, now: int, *, owner: str, lease_s: int) -> Moved:
    def ready(run: EvalRun) -> str | None:
        return None if run.status == "queued" else f"it is {run.status}"

    moved = leases.claim(session, EVAL_RUN, run_id, owner, now, lease_s, ready)
    if moved.ok:
        session.get(EvalRun, run_id).updated_at = now
    return moved


def owned(session: Session, run_id: str, owner: str) -> EvalRun | None:
    return leases.owned(session, EvalRun, run_id, owner)


def begin(session: Session, run_id: str, owner: str, now: int, *, billing_enabled: bool, quote: dict | None) -> Moved:
    """`queued` → `in_progress` (again after a lost driver: the hold is taken once). Billing on, with a quote:
    the quote's most is held first; a run the credit cannot fund fails `insufficient_quota`."""
    run = owned(session, run_id, owner)
    if run is None:
        return leases.NOT_OWNED
    if run.status != "queued":  # canceled after the claim: let it go (nothing was held)
        leases.release(run)
        return Moved(False, run.status, f"it is {run.status}")
    if billing_enabled and quote is not None:
        run.quote = quote
        if not billing.hold(session, run, now):
            available = credit(session, run.account_id).available_cents
            _end(session, run, "failed", now, error={"code": "insufficient_quota", "message": (
                f"Not enough credit to start the run: it can cost up to {to_usd(quote['max_charge_cents']):.2f} USD "
                f"and {to_usd(max(available, 0)):.2f} USD is available. Nothing ran. Add credit and create the run "
                "again.")})
            return Moved(False, "failed", "insufficient_quota")
    run.status, run.started_at, run.updated_at = "in_progress", run.started_at or now, now
    return Moved(True, run.status)


def record(session: Session, run_id: str, owner: str, items: list[EvalOutputItem]) -> bool:
    """Add graded items while the driver holds the lease (a canceled run still takes what its
    driver finished); False when the lease is not the caller's (nothing is written)."""
    run = owned(session, run_id, owner)
    if run is None:
        return False
    session.add_all(items)
    return True


def finish(session: Session, run_id: str, owner: str, now: int, *, counts: dict, per_criteria: list,
           usage: list, billed_tokens: int) -> Moved:
    """The driver's end: `completed` (a canceled run stays canceled) with its counts and usage, the
    charge of its real tokens (never more than the hold), and the lease released."""
    run = owned(session, run_id, owner)
    if run is None:
        return leases.NOT_OWNED
    run.result_counts, run.per_criteria, run.per_model_usage = counts, per_criteria, usage
    if run.status == "in_progress":
        _end(session, run, "completed", now)
    else:
        leases.release(run)
        run.updated_at = now
    billing.settle(session, run, now, tokens=billed_tokens)
    return Moved(True, run.status)


def fail(session: Session, run_id: str, owner: str, now: int, code: str, message: str) -> Moved:
    """The driver could not run it (a platform failure): `failed`, nothing charged."""
    run = owned(session, run_id, owner)
    if run is None:
        return leases.NOT_OWNED
    if run.status in RUN_ENDED:
        leases.release(run)
        billing.settle(session, run, now, tokens=0)
        return Moved(False, run.status, f"it is {run.status}")
    _end(session, run, "failed", now, error={"code": code, "message": message})
    billing.settle(session, run, now, tokens=0)
    return Moved(True, "failed")


def _end(session: Session, run: EvalRun, status: str, now: int, *, error: dict | None = None,
         keep_lease: bool = False) -> None:
    run.status, run.ended_at, run.updated_at = status, now, now
    if error is not None:
        run.error = error
    if not keep_lease:
        leases.release(run)
    # Every end passes here, in its caller's transaction: its webhooks commit with it.
    outbox.enqueue(session, run.account_id, events.EVAL_RUN_EVENTS[status], run.id, now)


def lose(session: Session, run: EvalRun, now: int) -> Moved:
    """Its driver is gone (the caller holds the run's lock). An `in_progress` run is claimed again
    once (the items it recorded are kept, the rest graded), then fails `eval_run_interrupted`; a
    canceled one keeps what was recorded. Nothing is charged for a lost driver's work."""
    leases.release(run)
    run.updated_at = now
    if run.status == "in_progress" and leases.exhausted(EVAL_RUN, run):
        _end(session, run, "failed", now, error={"code": EVAL_RUN.exhausted_code, "message": (
            "The worker running the eval run was lost twice; the run is not tried again. Nothing was charged: "
            "create the run again.")})
    elif run.status == "in_progress":
        run.status = "queued"  # requeued: the next claim grades the items not yet recorded
    if run.status in RUN_ENDED:
        billing.settle(session, run, now, tokens=0)
    return Moved(True, run.status)
