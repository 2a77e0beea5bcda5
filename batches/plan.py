"""A batch's plan: what the create-time scan found (batches/scan.py) and what its driver runs
(batches/run.py). Stored as JSON on the batch row (`plan.record()`) and read back typed
(`Plan.from_record`), so nothing reads the stored dict by string keys."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipelines.batch_plan import LineRefusal  # what every line naming a model that cannot run gets


@dataclass(frozen=True)
class PlannedModel:
    name: str  # as input lines name it in body.model (base id, ft: name, checkpoint name)
    kind: str  # base | ft | checkpoint (jobs/model_names.py ResolvedModel.kind)
    adapter_prefix: str | None  # where its adapter files are stored; None for the base


@dataclass(frozen=True)
class Plan:
    base_id: str
    models: tuple[PlannedModel, ...]  # the runnable ones, the base first when named
    refused_models: dict[str, LineRefusal]  # body.model -> why its lines do not run
    lines: int
    tokens_upper_bound: int  # every line's prompt bytes + template overhead + max tokens, each at most the context

    def record(self) -> dict[str, Any]:
        """The JSON stored in `batches.plan`."""
        return asdict(self) | {"models": [asdict(m) for m in self.models]}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Plan:
        return cls(
            base_id=record["base_id"], models=tuple(PlannedModel(**m) for m in record["models"]),
            refused_models={name: LineRefusal(**r) for name, r in record["refused_models"].items()},
            lines=record["lines"], tokens_upper_bound=record["tokens_upper_bound"],
        )
