"""Account billing for operators and the create-time limits.

Where it sits: the admin router and the `openft accounts credit|show|limits` commands call the
account functions here; `fine_tuning_jobs.create_job` calls `check_create_limits` under the
account row's lock, after the open-job check, so concurrent creates see each other's jobs.
The ledger and the charge rules live in `storage/billing.py`.

Limits (the reference's "The job" and "Limits"): models per account counts stored models plus
open jobs (each open job reserves a slot). The USD day limit, enforced when billing is on, counts
what the account's jobs created this UTC day commit: an open job its `max_charge_usd`, an ended
job its charge (0 when it was not charged). It resets at 00:00 UTC; deposits do not change it.
"""

from __future__ import annotations

from sqlalchemy import select

from openft.errors import InvalidRequest, NotFound, RateLimited
from openft.settings import Settings
from serve_app.schemas.billing import AccountLimits, AccountUsage, BillingAccount
from serve_app.schemas.billing import LedgerEntry as LedgerEntryOut
from serve_app.schemas.common import Page
from serve_app.services.paging import check_limit
from storage import billing
from storage import jobs as jobs_repo
from storage.db import Database
from storage.models import Account, LedgerEntry
from storage.models import AccountLimits as LimitsRow

DAY = 86400


def utc_day(now: int) -> tuple[int, int]:
    start = now - now % DAY
    return start, start + DAY


def _cents(value: object, param: str) -> int:
    try:
        cents = billing.to_cents(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be a USD amount in whole cents, such as 25.00.", code="invalid_value",
                             param=param) from None
    if cents < 0:
        raise InvalidRequest(f"{param} must not be negative.", code="invalid_value", param=param)
    return cents


def effective_limits(session, account: Account, settings: Settings) -> tuple[int, int, int]:
    """(open jobs, USD per day in cents, models): the account's own where set, else the defaults."""
    row = session.get(LimitsRow, account.id)
    day = row.usd_per_day_cents if row and row.usd_per_day_cents is not None else billing.to_cents(
        f"{settings.usd_per_day_limit:.2f}")
    models = row.models if row and row.models is not None else settings.models_per_account
    return account.open_jobs_limit, day, models


def check_create_limits(session, account: Account, settings: Settings, max_charge_usd: float, now: int) -> None:
    """Refuse a create over the model limit or (billing on) the USD day limit: 429 limit_exceeded."""
    _, day_cents, models = effective_limits(session, account, settings)
    used = billing.models_in_use(session, account.id)
    if used >= models:
        raise RateLimited(
            f"Your account can hold {models} fine-tuned models, counting one for each open job, and holds {used}. "
            "Delete a model or wait for a job to end, then create the job again.",
            limit=models, current=used,
        )
    if not settings.billing_enabled:
        return
    start, end = utc_day(now)
    committed = billing.committed_cents(session, account.id, start, end)
    need = billing.to_cents(max_charge_usd)
    if committed + need > day_cents:
        raise RateLimited(
            f"Your account can commit {billing.to_usd(day_cents):.2f} USD to jobs per UTC day and has committed "
            f"{billing.to_usd(committed):.2f} USD today; this job can cost up to {billing.to_usd(need):.2f} USD. "
            "The limit resets at 00:00 UTC; a deposit does not raise it.",
            limit=billing.to_usd(day_cents), current=billing.to_usd(committed),
        )


def find_account(session, ref: str) -> Account:
    """An account by id (`acct-...`) or name."""
    account = session.get(Account, ref) or session.scalar(select(Account).where(Account.name == ref))
    if account is None:
        raise NotFound("No such account.", param="account")
    return account


def summary(session, account: Account, settings: Settings, now: int) -> BillingAccount:
    open_jobs, day_cents, models = effective_limits(session, account, settings)
    credit = billing.credit(session, account.id)
    start, end = utc_day(now)
    return BillingAccount(
        id=account.id, name=account.name, balance_usd=billing.to_usd(credit.balance_cents),
        held_usd=billing.to_usd(credit.held_cents), available_usd=billing.to_usd(credit.available_cents),
        limits=AccountLimits(open_jobs=open_jobs, usd_per_day=billing.to_usd(day_cents), models=models),
        usage=AccountUsage(
            open_jobs=jobs_repo.count_open_jobs(session, account.id), models=billing.models_in_use(session, account.id),
            usd_today=billing.to_usd(billing.committed_cents(session, account.id, start, end)), day_resets_at=end,
            charged_usd=billing.to_usd(billing.charged_cents(session, account.id)),
        ),
    )


def account_summary(db: Database, settings: Settings, ref: str, now: int) -> BillingAccount:
    with db.session() as session:
        return summary(session, find_account(session, ref), settings, now)


def add_credit(db: Database, settings: Settings, ref: str, usd: object, now: int, *, note: str | None = None,
               key: str | None = None) -> BillingAccount:
    cents = _cents(usd, "usd")
    if cents == 0:
        raise InvalidRequest("usd must be above 0.", code="invalid_value", param="usd")
    with db.session() as session:
        account = find_account(session, ref)
        billing.deposit(session, account, cents, now, established_open_jobs=settings.established_account_open_jobs,
                        note=note, key=f"deposit:{account.id}:{key}" if key else None)
        return summary(session, account, settings, now)


def set_limits(db: Database, settings: Settings, ref: str, now: int, *, open_jobs: int | None = None,
               usd_per_day: object = None, models: int | None = None) -> BillingAccount:
    day_cents = None if usd_per_day is None else _cents(usd_per_day, "usd_per_day")
    with db.session() as session:
        account = find_account(session, ref)
        row = billing.limits_row(session, account.id)
        if open_jobs is not None:
            account.open_jobs_limit, row.open_jobs_set = open_jobs, True
        if day_cents is not None:
            row.usd_per_day_cents = day_cents
        if models is not None:
            row.models = models
        session.flush()
        return summary(session, account, settings, now)


def list_ledger(db: Database, ref: str, *, limit: int, after: int | None) -> Page[LedgerEntryOut]:
    """Newest first; `after` is the id of the last entry of the previous page."""
    check_limit(limit, 100)
    with db.session() as session:
        account = find_account(session, ref)
        query = select(LedgerEntry).where(LedgerEntry.account_id == account.id)
        if after is not None:
            query = query.where(LedgerEntry.seq < after)
        rows = session.scalars(query.order_by(LedgerEntry.seq.desc()).limit(limit + 1)).all()
        data = [LedgerEntryOut(id=e.seq, kind=e.kind, usd=billing.to_usd(e.amount_cents), job_id=e.job_id,
                               note=e.note, created_at=e.created_at) for e in rows[:limit]]
    return Page[LedgerEntryOut](data=data, has_more=len(rows) > limit,
                                first_id=str(data[0].id) if data else None, last_id=str(data[-1].id) if data else None)
