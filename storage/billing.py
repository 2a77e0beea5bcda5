"""The credit ledger and the per-token charge: holds when a job starts, the charge when it ends.

Where it sits: the job controller calls `hold_for_start` in the transaction that moves a job to
`running` (billing on); `storage.job_lifecycle.finish` calls `settle` in the transaction that ends
any job, so the charge and the end status commit together. The admin API and the CLI deposit.

Money is integer cents. The ledger is append-only; every entry's `amount_cents` is its effect on
the available credit, so available = the sum of all entries and balance = the sum of deposits,
refunds and charges. A job's `hold:`, `release:` and `charge:` entries carry unique idempotency
keys: a controller that restarts or replays a step cannot hold or charge twice.

Charge rules (the reference's "Costs" and "Errors"): a job is charged only if it started under
billing (it has a hold). Succeeded: trained tokens x rate, rounded half up to the cent, at least
the minimum, at most `max_charge_usd` from its quote. `trained_tokens` already counts every epoch
(train/loop.py). A user-side failure after training started (`adapter_quota_exceeded`): trained
tokens x rate without the minimum. Any other failure and a cancel: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.jobs import OPEN_STATUSES
from storage.models import Account, AccountLimits, FineTunedModel, Job, LedgerEntry

USER_SIDE_FAILURES = frozenset({"adapter_quota_exceeded"})
MONEY_KINDS = ("deposit", "refund", "charge")
HOLD_KINDS = ("hold", "release")


@dataclass(frozen=True)
class Credit:
    balance_cents: int
    held_cents: int

    @property
    def available_cents(self) -> int:
        return self.balance_cents - self.held_cents


def to_cents(usd: object) -> int:
    """Whole cents of a USD amount given as text or a number; refuses fractions of a cent."""
    try:
        cents = Decimal(str(usd)) * 100
    except InvalidOperation:
        raise ValueError("the amount is not a number") from None
    if not cents.is_finite() or cents != cents.to_integral_value():
        raise ValueError("the amount must be a whole number of cents")
    return int(cents)


def to_usd(cents: int) -> float:
    return float(Decimal(cents) / 100)


def _has_key(session: Session, key: str) -> bool:
    return session.scalar(select(LedgerEntry.seq).where(LedgerEntry.idempotency_key == key)) is not None


def add_entry(
    session: Session, account_id: str, kind: str, amount_cents: int, now: int, *,
    job_id: str | None = None, key: str | None = None, note: str | None = None,
) -> LedgerEntry | None:
    """Append one entry; None when an entry with `key` exists already (the step was done)."""
    if key is not None and _has_key(session, key):
        return None
    entry = LedgerEntry(account_id=account_id, kind=kind, amount_cents=amount_cents, job_id=job_id,
                        idempotency_key=key, note=note, created_at=now)
    session.add(entry)
    session.flush()
    return entry


def credit(session: Session, account_id: str) -> Credit:
    sums = dict(session.execute(
        select(LedgerEntry.kind, func.sum(LedgerEntry.amount_cents))
        .where(LedgerEntry.account_id == account_id).group_by(LedgerEntry.kind)
    ).all())
    return Credit(
        balance_cents=int(sum(sums.get(k) or 0 for k in MONEY_KINDS)),
        held_cents=-int(sum(sums.get(k) or 0 for k in HOLD_KINDS)),
    )


def charged_cents(session: Session, account_id: str) -> int:
    return -int(session.scalar(select(func.coalesce(func.sum(LedgerEntry.amount_cents), 0)).where(
        LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge")))


def deposit(
    session: Session, account: Account, cents: int, now: int, *, established_open_jobs: int,
    note: str | None = None, key: str | None = None,
) -> LedgerEntry | None:
    """Add credit. An account's first deposit makes it an established one: its open-job limit
    rises to `established_open_jobs` unless an operator set the limit explicitly."""
    if cents <= 0:
        raise ValueError("a deposit must be positive")
    entry = add_entry(session, account.id, "deposit", cents, now, key=key, note=note)
    limits = session.get(AccountLimits, account.id)
    if entry is not None and not (limits and limits.open_jobs_set):
        account.open_jobs_limit = max(account.open_jobs_limit, established_open_jobs)
    return entry


def limits_row(session: Session, account_id: str) -> AccountLimits:
    row = session.get(AccountLimits, account_id)
    if row is None:
        row = AccountLimits(account_id=account_id, open_jobs_set=False)
        session.add(row)
    return row


def models_in_use(session: Session, account_id: str) -> int:
    """Stored models plus open jobs: each open job reserves a model slot until it ends."""
    models = session.scalar(select(func.count()).select_from(FineTunedModel).where(
        FineTunedModel.account_id == account_id, FineTunedModel.deleted_at.is_(None)))
    jobs = session.scalar(select(func.count()).select_from(Job).where(
        Job.account_id == account_id, Job.status.in_(OPEN_STATUSES)))
    return models + jobs


def quote_cents(job: Job, field: str) -> int:
    """A `per_token` figure of the job's quote in cents (the quote holds whole cents)."""
    return int((Decimal(str(job.quote["per_token"][field])) * 100).to_integral_value(ROUND_HALF_UP))


def committed_cents(session: Session, account_id: str, start: int, end: int) -> int:
    """What jobs created in [start, end) commit: an open job its most, an ended one its charge."""
    total = 0
    for job in session.scalars(select(Job).where(
            Job.account_id == account_id, Job.created_at >= start, Job.created_at < end)):
        if job.status in OPEN_STATUSES:
            total += quote_cents(job, "max_charge_usd")
        elif job.charge:
            total += job.charge["cents"]
    return total


def hold_for_start(session: Session, job: Job, now: int) -> bool:
    """Hold the job's most (`max_charge_usd`) before it runs. A job the account's available
    credit cannot fund fails `insufficient_quota` here and False is returned. A job that holds
    already (requeued after a lost run, resumed) keeps its one hold."""
    from storage.job_lifecycle import finish, lock_account  # job_lifecycle imports this module

    lock_account(session, job.account_id)
    if _has_key(session, f"hold:{job.id}"):
        return True
    need = quote_cents(job, "max_charge_usd")
    available = credit(session, job.account_id).available_cents
    if available < need:
        finish(session, job, "failed", now, error={
            "code": "insufficient_quota", "param": None,
            "message": f"Not enough credit to start the job: it can cost up to {to_usd(need):.2f} USD and "
                       f"{to_usd(max(available, 0)):.2f} USD is available. Nothing ran. Add credit and create the "
                       "job again.",
        })
        return False
    add_entry(session, job.account_id, "hold", -need, now, job_id=job.id, key=f"hold:{job.id}")
    return True


def charge_for(status: str, error_code: str | None, trained_tokens: int | None, per_token: dict) -> tuple[int, str]:
    """(cents, basis) an ended job is charged under the rules in the module docstring."""
    if status == "succeeded":
        with_minimum = True
    elif status == "failed" and error_code in USER_SIDE_FAILURES:
        with_minimum = False
    else:
        return 0, "not_charged"
    rate = Decimal(str(per_token["trained_usd_per_mtok"]))
    # USD = tokens x rate / 1e6, so cents = tokens x rate / 1e4.
    cents = int((Decimal(trained_tokens or 0) * rate / 10_000).to_integral_value(ROUND_HALF_UP))
    basis = "trained_tokens"
    minimum = to_cents(per_token["minimum_usd"])
    most = to_cents(per_token["max_charge_usd"])
    if with_minimum and cents < minimum:
        cents, basis = minimum, "minimum"
    if cents > most:
        cents, basis = most, "max_charge"
    return cents, basis


def settle(session: Session, job: Job, now: int) -> None:
    """At the job's end, in the transaction that ends it: release its hold and charge it once."""
    hold = session.scalar(select(LedgerEntry).where(LedgerEntry.idempotency_key == f"hold:{job.id}"))
    if hold is None:
        return  # never started under billing: nothing held, nothing to charge
    if add_entry(session, job.account_id, "release", -hold.amount_cents, now, job_id=job.id,
                 key=f"release:{job.id}") is None:
        return  # settled already
    cents, basis = charge_for(job.status, (job.error or {}).get("code"), job.trained_tokens, job.quote["per_token"])
    if cents:
        add_entry(session, job.account_id, "charge", -cents, now, job_id=job.id, key=f"charge:{job.id}")
    job.charge = {"usd": to_usd(cents), "cents": cents, "basis": basis, "trained_tokens": job.trained_tokens or 0,
                  "trained_usd_per_mtok": job.quote["per_token"]["trained_usd_per_mtok"]}
