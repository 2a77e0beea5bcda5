"""A run's plan: what create found in its data source (evals/source.py) and what its driver runs
(evals/run.py). Stored as JSON on the run (`record()`), read back typed (`from_record`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """A completions run's generation: the model, resolved at create, and how each item asks it."""

    model: str  # as the caller named it (base id, ft: name, checkpoint name)
    base_id: str
    model_kind: str  # base | ft | checkpoint (jobs/model_names.py ResolvedModel.kind)
    template: tuple[dict, ...] | None  # [{role, content}] with {{item.*}} references; None: item_reference
    item_reference: str | None  # "item.<path>": each item's own list of messages
    max_tokens: int | None  # None: what the context leaves
    temperature: float
    top_p: float
    seed: int | None


@dataclass(frozen=True)
class RunPlan:
    kind: str  # jsonl | completions
    items: int
    sampling: Sampling | None  # None for a jsonl run (its items carry their samples)
    tokens_upper_bound: int  # generation + model graders, each request at most its context (the quote)
    rate_base_id: str | None  # whose batch rate the quote and charge use (None: nothing is charged)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunPlan:
        sampling = record["sampling"]
        if sampling is not None:
            template = sampling["template"]
            sampling = Sampling(**{**sampling, "template": tuple(template) if template is not None else None})
        return cls(kind=record["kind"], items=record["items"], sampling=sampling,
                   tokens_upper_bound=record["tokens_upper_bound"], rate_base_id=record["rate_base_id"])
