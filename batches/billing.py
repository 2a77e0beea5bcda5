"""A batch's money: the quote held when it starts, and the charge of its real tokens at its end.

Where it sits: batches/transitions.py `begin` holds and `finish`/`fail`/`lose` settle, in the
transaction that changes the status, so the ledger and the status commit together. The ledger
itself (entries, credit, idempotency keys) is storage/billing.py's; the rate is the price table's
batch rate of the batch's base (openft/pricing.py).

Rules: the quote's most is every line's upper bound on tokens (its prompt's UTF-8 bytes plus the
template's overhead, plus its max tokens, at most the base's context: a token is at least one byte)
at the base's batch rate, rounded up to the cent. The charge is the real prompt and completion
tokens of the lines that completed, at the same rate, rounded half up, never more than the hold.
A failed or interrupted batch is charged nothing; a cancelled or expired one pays for the lines
it finished. No per-batch minimum.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from openft.settings import Settings
from storage.billing import add_entry, credit, to_usd
from storage.models import Batch, LedgerEntry


def quote(settings: Settings, base_id: str, tokens_upper_bound: int) -> dict:
    rate = settings.prices.batch_usd_per_mtok(base_id)
    cents = math.ceil(Decimal(tokens_upper_bound) * Decimal(str(rate)) / 10_000)
    return {"tokens_upper_bound": tokens_upper_bound, "batch_usd_per_mtok": rate, "max_charge_usd": to_usd(cents),
            "max_charge_cents": cents}


def hold(session: Session, batch: Batch, now: int) -> bool:
    """Hold the quote's most; True when held (or held already), False when the credit cannot fund it."""
    key = f"hold:{batch.id}"
    if session.scalar(select(LedgerEntry.seq).where(LedgerEntry.idempotency_key == key)) is not None:
        return True
    need = batch.quote["max_charge_cents"]
    if credit(session, batch.account_id).available_cents < need:
        return False
    add_entry(session, batch.account_id, "hold", -need, now, job_id=batch.id, key=key)
    return True


def shortfall_message(session: Session, batch: Batch) -> str:
    need, available = batch.quote["max_charge_cents"], credit(session, batch.account_id).available_cents
    return (f"Not enough credit to start the batch: it can cost up to {to_usd(need):.2f} USD and "
            f"{to_usd(max(available, 0)):.2f} USD is available. Nothing ran. Add credit and create the batch again.")


def settle(session: Session, batch: Batch, now: int, *, tokens: int = 0) -> None:
    """Release the hold and charge `tokens` (completed lines' prompt + completion) once."""
    held = session.scalar(select(LedgerEntry).where(LedgerEntry.idempotency_key == f"hold:{batch.id}"))
    if held is None:
        return  # never started under billing
    if add_entry(session, batch.account_id, "release", -held.amount_cents, now, job_id=batch.id,
                 key=f"release:{batch.id}") is None:
        return  # settled already
    rate = Decimal(str(batch.quote["batch_usd_per_mtok"]))
    cents = int((Decimal(tokens) * rate / 10_000).to_integral_value(ROUND_HALF_UP)) if batch.status != "failed" else 0
    basis = "tokens" if cents <= -held.amount_cents else "max_charge"
    cents = min(cents, -held.amount_cents)
    if cents:
        add_entry(session, batch.account_id, "charge", -cents, now, job_id=batch.id, key=f"charge:{batch.id}")
    batch.charge = {"usd": to_usd(cents), "cents": cents, "basis": basis if cents else "not_charged",
                    "tokens": tokens if batch.status != "failed" else 0, "batch_usd_per_mtok": batch.quote["batch_usd_per_mtok"]}
