"""Wire objects of the admin billing API (`/v1/gridline/admin/accounts/...`). USD as numbers
holding whole cents, like the quote."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NO_NUL = r"^[^\x00]*$"


class CreditRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    usd: str | float
    """USD to add, a whole number of cents above 0 ("25.00" or 25)."""
    # No NUL characters: PostgreSQL cannot store them in text (they answered 500).
    note: str | None = Field(None, max_length=200, pattern=NO_NUL)
    """Why, for the ledger (an invoice number, a promotion)."""
    idempotency_key: str | None = Field(None, min_length=1, max_length=120, pattern=NO_NUL)
    """A retried request with the same key adds the credit once."""


class LimitsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    open_jobs: int | None = Field(None, ge=0, le=1000)
    """Open fine-tuning jobs at once; setting it keeps a deposit from raising it."""
    usd_per_day: str | float | None = None
    """USD of jobs the account may create per UTC day (billing on)."""
    models: int | None = Field(None, ge=0, le=1_000_000)
    """Fine-tuned models, each open job reserving one."""


class AccountLimits(BaseModel):
    open_jobs: int
    usd_per_day: float
    models: int


class AccountUsage(BaseModel):
    open_jobs: int
    """Jobs not ended."""
    models: int
    """Stored models plus open jobs, as the model limit counts them."""
    usd_today: float
    """What jobs created this UTC day commit: an open job its max_charge_usd, an ended one its charge."""
    day_resets_at: int
    """The next 00:00 UTC, unix seconds."""
    charged_usd: float
    """Every charge so far."""


class BillingAccount(BaseModel):
    object: Literal["gridline.account"] = "gridline.account"
    id: str
    name: str
    balance_usd: float
    """Deposits and refunds less charges."""
    held_usd: float
    """Held for running jobs: each job's max_charge_usd until it ends."""
    available_usd: float
    """balance_usd less held_usd: what the credit check at a job's start compares with."""
    limits: AccountLimits
    usage: AccountUsage


class LedgerEntry(BaseModel):
    object: Literal["gridline.ledger_entry"] = "gridline.ledger_entry"
    id: int
    kind: Literal["deposit", "hold", "release", "charge", "refund"]
    usd: float
    """The entry's effect on available credit: + deposit, refund, release; - hold, charge."""
    job_id: str | None = None
    note: str | None = None
    created_at: int
