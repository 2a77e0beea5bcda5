"""The credit ledger and the per-token charge: holds when a job starts, the charge when it ends.

Money only: whether a job's most can be held, the hold, and the settlement. Where it sits: the
job's `start` transition (jobs/transitions.py) calls `hold` in the transaction that moves a job to
`running` (billing on) and decides what a refusal does; `finish` calls `settle` in the transaction
that ends any job, so the charge and the end status commit together. The admin API and the CLI
deposit. The limits built on these sums (USD per day, models) live in jobs/limits.py.

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

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import paging
from storage.models import Account, Job, LedgerEntry, OnlineUsage

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
    session: Session, account: Account, cents: int, now: int, *, note: str | None = None, key: str | None = None,
) -> LedgerEntry | None:
    """Add credit; None when `key` was deposited already. What a first deposit does to the account's
    limits is jobs/limits.py's `on_deposit`."""
    if cents <= 0:
        raise ValueError("a deposit must be positive")
    return add_entry(session, account.id, "deposit", cents, now, key=key, note=note)


def quote_cents(job: Job, field: str) -> int:
    """A `per_token` figure of the job's quote in cents (the quote holds whole cents)."""
    return int((Decimal(str(job.quote["per_token"][field])) * 100).to_integral_value(ROUND_HALF_UP))


def hold(session: Session, job: Job, now: int) -> bool:
    """Hold the job's most (`max_charge_usd`) from the account's available credit. True when held
    (or held already: a requeued or resumed job keeps its one hold); False when the credit cannot
    fund it, and then nothing is written. The caller holds the account's lock and decides what a
    refusal does to the job (jobs/transitions.py `start`)."""
    if _has_key(session, f"hold:{job.id}"):
        return True
    need = quote_cents(job, "max_charge_usd")
    if credit(session, job.account_id).available_cents < need:
        return False
    add_entry(session, job.account_id, "hold", -need, now, job_id=job.id, key=f"hold:{job.id}")
    return True


def shortfall_message(session: Session, job: Job) -> str:
    need = quote_cents(job, "max_charge_usd")
    available = credit(session, job.account_id).available_cents
    return (f"Not enough credit to start the job: it can cost up to {to_usd(need):.2f} USD and "
            f"{to_usd(max(available, 0)):.2f} USD is available. Nothing ran. Add credit and create the job again.")


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


def list_entries(session: Session, account_id: str, *, limit: int, after: int | None) -> tuple[Sequence[LedgerEntry], bool]:
    """The account's ledger, newest first; `after` is the id (seq) of the last entry of the previous page."""
    query = select(LedgerEntry).where(LedgerEntry.account_id == account_id)
    if after is not None:
        query = query.where(LedgerEntry.seq < after)
    return paging.first(session, query.order_by(LedgerEntry.seq.desc()), limit)  # keyed by seq alone: it is unique


# -- online chat completions (issue 27) --
_MICROCENTS_PER_CENT = 1_000_000


def online_most_cents(tokens: int, usd_per_mtok: float) -> int:
    """The most `tokens` can cost at `usd_per_mtok`, in whole cents rounded up."""
    return -(-_microcents(tokens, usd_per_mtok) // _MICROCENTS_PER_CENT)


def _microcents(tokens: int, usd_per_mtok: float) -> int:
    # USD = tokens x rate / 1e6, so micro-cents = tokens x rate x 100.
    return int((Decimal(tokens) * Decimal(str(usd_per_mtok)) * 100).to_integral_value(ROUND_HALF_UP))


def charge_online(session: Session, account_id: str, base: str, *, prompt_tokens: int, completion_tokens: int,
                  usd_per_mtok: float, now: int) -> int:
    """Add one online chat completion to the account's usage on `base` and charge the ledger the whole
    cents its accrued cost has passed since the last charge; returns the cents charged now. A request
    costs less than a cent, so the cost accrues in micro-cents and nothing is rounded away. The caller
    holds the account's lock (concurrent completions of one account add one after another)."""
    usage = session.get(OnlineUsage, (account_id, base))
    if usage is None:
        usage = OnlineUsage(account_id=account_id, base=base, requests=0, prompt_tokens=0, completion_tokens=0,
                            accrued_microcents=0, charged_cents=0, updated_at=now)
        session.add(usage)
    usage.requests += 1
    usage.prompt_tokens += prompt_tokens
    usage.completion_tokens += completion_tokens
    usage.accrued_microcents += _microcents(prompt_tokens + completion_tokens, usd_per_mtok)
    usage.updated_at = now
    cents = usage.accrued_microcents // _MICROCENTS_PER_CENT - usage.charged_cents
    if cents > 0:
        usage.charged_cents += cents
        add_entry(session, account_id, "charge", -cents, now, note=f"online chat completions on {base}")
    session.flush()
    return cents
