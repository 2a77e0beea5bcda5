"""What a batch's driver hands `run_batch` (pipelines/batch_ray.py): the plan of one run, by value.
Light to import (no Ray, no torch): the batch package's stored plan (batches/plan.py) is made of
the same refusals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchModel:
    name: str  # as input lines name it in body.model (base id, ft: name, checkpoint name)
    adapter_prefix: str | None  # store prefix (ends with "/") of the STAGED peft adapter files; None = base


@dataclass(frozen=True)
class LineRefusal:
    status_code: int
    code: str
    message: str


@dataclass(frozen=True)
class BatchPlan:
    batch_id: str
    account_id: str
    base_id: str
    input_key: str
    models: tuple[BatchModel, ...]
    refused_models: dict[str, LineRefusal]
    output_key: str
    error_key: str
    shard_prefix: str
    created_at: int
