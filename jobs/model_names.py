"""The one resolver of model names for batches: a base id, an `ft:` model, or a checkpoint name.

h3 owns this module (checkpoints are models, issue 13); this is the minimal version batches need
until that branch lands, with the same names and signature: bases and `ft:` models, no
checkpoints yet. Another account's model is answered as unknown (None), like a deleted one.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from catalog.bases import BASES
from storage.models import FineTunedModel


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    base_id: str
    kind: str  # "base" | "ft" | "checkpoint"
    adapter_prefix: str | None  # store prefix (ends "/") of the peft-format adapter files
    servable: bool
    reason: str | None


def resolve_model(session, account_id: str, name: str) -> ResolvedModel | None:
    """None: unknown, another account's or deleted (all answered as not found)."""
    base = BASES.get(name)
    if base is not None:
        return ResolvedModel(name, base.id, "base", None, base.servable, base.not_servable_reason)
    row = session.scalar(select(FineTunedModel).where(
        FineTunedModel.id == name, FineTunedModel.account_id == account_id, FineTunedModel.deleted_at.is_(None)))
    if row is None:
        return None
    return ResolvedModel(row.id, row.base, "ft", row.adapter_prefix.rstrip("/") + "/", row.servable, row.reason)
