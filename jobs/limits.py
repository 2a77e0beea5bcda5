"""An account's limits, computed once: open jobs, fine-tuned models, and USD committed per UTC day.

Where it sits: job create (serve_app/services/fine_tuning_jobs.py) calls `check_create` under the
account's lock, after its own quick check; adapter registration (jobs/registration.py) calls
`check_model_quota`; the operator's account summary (serve_app/services/billing.py) reads
`effective` and `usage`. The ledger sums come from storage/billing.py (money only).

Rules (the reference's "The job" and "Limits"):
- Open jobs: `validating_files`, `queued`, `running` and `paused` jobs count. A new account may
  have `new_account_open_jobs`; its first deposit raises that to `established_account_open_jobs`
  unless an operator set the limit.
- Models: stored models plus open jobs, since each open job reserves the model it will register;
  the quota is the account's own where an operator set it, else `models_per_account` (`models_quota`).
- USD per day (billing on): what the account's jobs created this UTC day commit, an open job its
  `max_charge_usd`, an ended one its charge. Resets at 00:00 UTC; a deposit does not raise it.
  A distill-shortcut job has no quote until it is distilled: it commits nothing until then, and
  its own check runs at its admission (jobs/distilling.py `distilled`), not at create.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from openft.errors import RateLimited
from openft.settings import Settings
from storage import billing
from storage import jobs as jobs_repo
from storage.accounts import limits_row
from storage.jobs import OPEN_STATUSES
from storage.models import Account, AccountLimits, FineTunedModel, Job

DAY = 86400


@dataclass(frozen=True)
class Limits:
    open_jobs: int
    usd_per_day_cents: int
    models: int


@dataclass(frozen=True)
class Usage:
    open_jobs: int
    models: int
    committed_cents: int  # this UTC day
    day_resets_at: int


def utc_day(now: int) -> tuple[int, int]:
    start = now - now % DAY
    return start, start + DAY


def effective(session: Session, account: Account, settings: Settings) -> Limits:
    """The account's own limits where an operator set them, else the settings' defaults."""
    row = session.get(AccountLimits, account.id)
    day = row.usd_per_day_cents if row and row.usd_per_day_cents is not None else billing.to_cents(
        f"{settings.usd_per_day_limit:.2f}")
    return Limits(open_jobs=account.open_jobs_limit, usd_per_day_cents=day,
                  models=models_quota(session, account.id, settings))


def models_quota(session: Session, account_id: str, settings: Settings) -> int:
    """The fine-tuned models an account may hold: the operator's limit for it, else the setting's."""
    row = session.get(AccountLimits, account_id)
    return row.models if row is not None and row.models is not None else settings.models_per_account


def models_in_use(session: Session, account_id: str, *, except_job: str | None = None) -> int:
    """Stored models plus open jobs (each reserves a model slot until it ends)."""
    models = session.scalar(select(func.count()).select_from(FineTunedModel).where(
        FineTunedModel.account_id == account_id, FineTunedModel.deleted_at.is_(None)))
    return models + jobs_repo.count_open_jobs(session, account_id, except_job=except_job)


def committed_cents(session: Session, account_id: str, start: int, end: int) -> int:
    """What jobs created in [start, end) commit: an open job its most, an ended one its charge."""
    total = 0
    for job in session.scalars(select(Job).where(
            Job.account_id == account_id, Job.created_at >= start, Job.created_at < end)):
        if job.status in OPEN_STATUSES:
            if job.quote:  # a distilling job is not quoted yet
                total += billing.quote_cents(job, "max_charge_usd")
        elif job.charge:
            total += job.charge["cents"]
    return total


def usage(session: Session, account: Account, now: int) -> Usage:
    start, end = utc_day(now)
    return Usage(open_jobs=jobs_repo.count_open_jobs(session, account.id), models=models_in_use(session, account.id),
                 committed_cents=committed_cents(session, account.id, start, end), day_resets_at=end)


def open_jobs_refusal(limit: int, current: int) -> RateLimited:
    return RateLimited(
        f"Your account can have {limit} open fine-tuning job(s) and has {current}. "
        "Retry after a job ends, or cancel one.",
        limit=limit, current=current,
    )


def check_open_jobs(session: Session, account: Account) -> None:
    current = jobs_repo.count_open_jobs(session, account.id)
    if current >= account.open_jobs_limit:
        raise open_jobs_refusal(account.open_jobs_limit, current)


def check_create(
    session: Session, account: Account, settings: Settings, max_charge_usd: float | None, now: int,
) -> None:
    """Refuse a create over any limit: 429 limit_exceeded with the limit and current use. The
    caller holds the account's lock, so concurrent creates see each other's jobs. `max_charge_usd`
    None: the job is not quoted yet (distill shortcut); its USD per day is checked at admission."""
    check_open_jobs(session, account)
    limits = effective(session, account, settings)
    used = models_in_use(session, account.id)
    if used >= limits.models:
        raise RateLimited(
            f"Your account can hold {limits.models} fine-tuned models, counting one for each open job, and holds "
            f"{used}. Delete a model or wait for a job to end, then create the job again.",
            limit=limits.models, current=used,
        )
    if settings.billing_enabled and max_charge_usd is not None:
        check_usd_per_day(session, account, settings, max_charge_usd, now)


def check_usd_per_day(session: Session, account: Account, settings: Settings, max_charge_usd: float, now: int) -> None:
    """Refuse a job whose most would take the account past its USD per UTC day (caller holds the lock)."""
    limits = effective(session, account, settings)
    start, end = utc_day(now)
    committed = committed_cents(session, account.id, start, end)
    need = billing.to_cents(max_charge_usd)
    if committed + need > limits.usd_per_day_cents:
        raise RateLimited(
            f"Your account can commit {billing.to_usd(limits.usd_per_day_cents):.2f} USD to jobs per UTC day and has "
            f"committed {billing.to_usd(committed):.2f} USD today; this job can cost up to {billing.to_usd(need):.2f} "
            "USD. The limit resets at 00:00 UTC; a deposit does not raise it.",
            limit=billing.to_usd(limits.usd_per_day_cents), current=billing.to_usd(committed),
        )


def check_model_quota(session: Session, job: Job, settings: Settings) -> tuple[int, int] | None:
    """At registration: None if the job's model fits, else (models held, quota). The job's own
    reservation is the slot it fills, so only the account's other open jobs count."""
    quota = models_quota(session, job.account_id, settings)
    used = models_in_use(session, job.account_id, except_job=job.id)
    if used >= quota:
        held = used - jobs_repo.count_open_jobs(session, job.account_id, except_job=job.id)
        return held, quota
    return None


def on_deposit(session: Session, account: Account, settings: Settings) -> None:
    """A deposit makes an account established: its open-job limit rises unless an operator set it."""
    row = limits_row(session, account.id)
    if not row.open_jobs_set:
        account.open_jobs_limit = max(account.open_jobs_limit, settings.established_account_open_jobs)


def set_open_jobs(session: Session, account: Account, limit: int) -> None:
    """An operator's explicit limit: later deposits leave it as set."""
    account.open_jobs_limit = limit
    limits_row(session, account.id).open_jobs_set = True
