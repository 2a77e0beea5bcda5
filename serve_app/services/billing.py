"""Account billing for operators and the create-time limits.

Where it sits: the admin router and the `openft accounts credit|show|limits` commands call the
account functions here. The ledger and the charge rules live in `storage/billing.py`; the limits
(open jobs, models, USD per day) and what a deposit does to them in `jobs/limits.py`.
"""

from __future__ import annotations

from openft.errors import InvalidRequest, NotFound
from openft.settings import Settings
from serve_app.schemas.billing import AccountLimits, AccountUsage, BillingAccount
from serve_app.schemas.billing import LedgerEntry as LedgerEntryOut
from serve_app.schemas.common import Page
from serve_app.services.paging import check_limit
from jobs import limits
from storage import billing
from storage.accounts import get_account_by_name, limits_row
from storage.db import Database
from storage.models import Account



# The largest amount one credit or daily limit may name: balances are summed in 64-bit columns
# (PostgreSQL refused 1e224 USD with an overflow, a 500).
MAX_CENTS = 10**14


def _cents(value: object, param: str) -> int:
    try:
        cents = billing.to_cents(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be a USD amount in whole cents, such as 25.00.", code="invalid_value",
                             param=param) from None
    if cents < 0:
        raise InvalidRequest(f"{param} must not be negative.", code="invalid_value", param=param)
    if cents > MAX_CENTS:
        raise InvalidRequest(f"{param} must be at most {MAX_CENTS // 100:,} USD.", code="invalid_value", param=param)
    return cents


def find_account(session, ref: str) -> Account:
    """An account by id (`acct-...`) or name."""
    account = session.get(Account, ref) or get_account_by_name(session, ref)
    if account is None:
        raise NotFound("No such account.", param="account")
    return account


def summary(session, account: Account, settings: Settings, now: int) -> BillingAccount:
    own = limits.effective(session, account, settings)
    used = limits.usage(session, account, now)
    credit = billing.credit(session, account.id)
    return BillingAccount(
        id=account.id, name=account.name, balance_usd=billing.to_usd(credit.balance_cents),
        held_usd=billing.to_usd(credit.held_cents), available_usd=billing.to_usd(credit.available_cents),
        limits=AccountLimits(open_jobs=own.open_jobs, usd_per_day=billing.to_usd(own.usd_per_day_cents),
                             models=own.models),
        usage=AccountUsage(
            open_jobs=used.open_jobs, models=used.models, usd_today=billing.to_usd(used.committed_cents),
            day_resets_at=used.day_resets_at, charged_usd=billing.to_usd(billing.charged_cents(session, account.id)),
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
        if billing.deposit(session, account, cents, now, note=note,
                           key=f"deposit:{account.id}:{key}" if key else None) is not None:
            limits.on_deposit(session, account, settings)
        return summary(session, account, settings, now)


def set_limits(db: Database, settings: Settings, ref: str, now: int, *, open_jobs: int | None = None,
               usd_per_day: object = None, models: int | None = None) -> BillingAccount:
    day_cents = None if usd_per_day is None else _cents(usd_per_day, "usd_per_day")
    with db.session() as session:
        account = find_account(session, ref)
        row = limits_row(session, account.id)
        if open_jobs is not None:
            limits.set_open_jobs(session, account, open_jobs)
        if day_cents is not None:
            row.usd_per_day_cents = day_cents
        if models is not None:
            row.models = models
        session.flush()
        return summary(session, account, settings, now)


MAX_SEQ = 2**31 - 1  # ledger ids are 32-bit integers: a larger cursor overflowed PostgreSQL's comparison


def list_ledger(db: Database, ref: str, *, limit: int, after: int | None) -> Page[LedgerEntryOut]:
    """Newest first; `after` is the id of the last entry of the previous page."""
    check_limit(limit, 100)
    if after is not None and not 0 <= after <= MAX_SEQ:
        raise InvalidRequest("after must be the id of a ledger entry.", code="invalid_value", param="after")
    with db.session() as session:
        account = find_account(session, ref)
        rows, has_more = billing.list_entries(session, account.id, limit=limit, after=after)
        data = [LedgerEntryOut(id=e.seq, kind=e.kind, usd=billing.to_usd(e.amount_cents), job_id=e.job_id,
                               note=e.note, created_at=e.created_at) for e in rows]
    return Page[LedgerEntryOut](data=data, has_more=has_more,
                                first_id=str(data[0].id) if data else None, last_id=str(data[-1].id) if data else None)
