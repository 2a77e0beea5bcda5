"""The per-token price table the quote reads: a rate per base for supervised and for DPO, and
the per-job minimum.

It is a plain pydantic model so that `Settings` can carry it (and an operator can replace it as
JSON); nothing here reads the environment. That a table prices every base of the catalog is the
catalog's check (catalog/bases.py `unpriced`), which `openft serve` runs before it starts
(entrypoints/preflight.py): the core imports nothing above it. The defaults are plausible list prices, in USD per
million trained tokens, scaled with the GPU time a token costs on each base. QLoRA is charged the
LoRA rate (one rate per base), long-context jobs the same rate, and DPO twice the supervised rate
because it trains about 2 times slower (reference pass, two answers per prompt).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BaseRate(BaseModel):
    model_config = ConfigDict(frozen=True)

    supervised_usd_per_mtok: float = Field(gt=0)
    """USD per million trained tokens (tokens x epochs) for LoRA and QLoRA."""
    dpo_usd_per_mtok: float = Field(gt=0)
    """USD per million DPO training tokens: the prompt and both answers, every epoch."""
    batch_usd_per_mtok: float | None = Field(None, gt=0)
    """USD per million tokens a batch on this base or its ft: models processes (prompt and completion);
    None: a quarter of the supervised rate (a token generated costs less GPU time than one trained)."""
    online_usd_per_mtok: float | None = Field(None, gt=0)
    """USD per million tokens an online chat completion on this base or its ft: models processes (prompt
    and completion); None: twice the batch rate (OpenAI's batches cost half its online rates)."""


def _rate(supervised: float) -> BaseRate:
    return BaseRate(supervised_usd_per_mtok=supervised, dpo_usd_per_mtok=round(2 * supervised, 2))


DEFAULT_RATES: dict[str, BaseRate] = {
    "qwen2.5-0.5b-instruct": _rate(0.40),
    "qwen2.5-1.5b-instruct": _rate(0.80),
    "qwen2.5-7b-instruct": _rate(2.00),
    "mistral-7b-instruct-v0.3": _rate(2.00),
    "qwen3-8b": _rate(2.20),
    "llama-3.1-8b-instruct": _rate(2.20),
    "gpt-oss-20b": _rate(4.00),
    "qwen3.5-9b": _rate(2.60),
}


class PriceTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    minimum_usd: float = Field(0.50, ge=0)
    """The least a succeeded job is charged."""
    rates: dict[str, BaseRate] = Field(default_factory=lambda: dict(DEFAULT_RATES))
    """Per base id; must cover every catalog base (catalog/bases.py `unpriced`)."""

    def batch_usd_per_mtok(self, model: str) -> float:
        rate = self.rates[model]
        return rate.batch_usd_per_mtok if rate.batch_usd_per_mtok is not None else round(rate.supervised_usd_per_mtok / 4, 4)

    def online_usd_per_mtok(self, model: str) -> float:
        rate = self.rates[model]
        return rate.online_usd_per_mtok if rate.online_usd_per_mtok is not None else round(2 * self.batch_usd_per_mtok(model), 4)

    def trained_usd_per_mtok(self, model: str, method_type: str) -> float:
        rate = self.rates[model]
        # Reinforcement's trained tokens are also generated: DPO's rate (jobs/quote.py says why).
        return rate.dpo_usd_per_mtok if method_type in ("dpo", "reinforcement") else rate.supervised_usd_per_mtok
