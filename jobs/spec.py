"""The job spec: the normalized create request, stored on the job row and read back typed.

Where it sits: jobs/params.py `parse_create_request` builds it from the create body; job create
(jobs/create.py) stores `spec.record()` in `jobs.spec`; the worker reads
`JobSpec.from_record(job.spec)` to build the run. Nothing reads the stored dict by string keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

# Keys that older rows carry beside the spec's fields (the wire forms, now computed).
_DERIVED_KEYS = frozenset({"hyperparameters", "method"})


@dataclass(frozen=True)
class JobSpec:
    model: str
    method_type: Literal["supervised", "dpo", "reinforcement"]
    adapter: Literal["lora", "qlora"]
    n_epochs: int
    batch_size: int
    learning_rate: float
    learning_rate_multiplier: float | None  # None when the caller gave `learning_rate`
    lora_rank: int
    lora_alpha: int
    max_seq_length: int
    beta: float | None  # DPO's beta; reinforcement's KL coefficient
    seed: int
    metadata: dict[str, str]
    suffix: str | None
    training_file: str
    validation_file: str | None
    warnings: tuple[str, ...] = field(default=())
    # The distill shortcut's record (results file, requests file, the files it made), when used.
    derived_from: dict[str, Any] | None = None
    # The `integrations` in their wire form (jobs/integrations.py), as the job object returns them.
    integrations: tuple[dict[str, Any], ...] = field(default=())
    # The ft: model or checkpoint the job continues from (jobs/lineage.py `Parent.record`), if any.
    parent: dict[str, Any] | None = None
    # Reinforcement only (jobs/reinforcement.py has their meaning and defaults); None otherwise.
    grader: dict[str, Any] | None = None  # graders.validate.record form
    compute_multiplier: float | None = None
    samples_per_prompt: int | None = None  # completions per prompt, from compute_multiplier
    eval_interval: int | None = None
    eval_samples: int | None = None
    reasoning_effort: str | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None

    def hyperparameters_wire(self, method: bool = False) -> dict[str, Any]:
        """The job object's `hyperparameters`: OpenAI's three fields, then ours. `beta` only in
        `method.dpo.hyperparameters` (`method=True`): OpenAI's top-level object has no such field."""
        wire: dict[str, Any] = {
            "n_epochs": self.n_epochs,
            "batch_size": self.batch_size,
            "learning_rate_multiplier": self.learning_rate_multiplier,
            "learning_rate": self.learning_rate,
            "lora_rank": self.lora_rank,
            "lora_alpha": self.lora_alpha,
            "max_seq_length": self.max_seq_length,
        }
        if method and self.method_type == "dpo":
            wire["beta"] = self.beta
        if method and self.method_type == "reinforcement":  # OpenAI's seven, then ours
            wire = {
                "batch_size": self.batch_size, "compute_multiplier": self.compute_multiplier,
                "eval_interval": self.eval_interval, "eval_samples": self.eval_samples,
                "learning_rate_multiplier": self.learning_rate_multiplier, "n_epochs": self.n_epochs,
                "reasoning_effort": self.reasoning_effort, "samples_per_prompt": self.samples_per_prompt,
                "max_completion_tokens": self.max_completion_tokens, "temperature": self.temperature, "beta": self.beta,
                "learning_rate": self.learning_rate, "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "max_seq_length": self.max_seq_length,
            }
        return wire

    def method_wire(self) -> dict[str, Any]:
        settings = {"hyperparameters": self.hyperparameters_wire(method=True), "adapter": self.adapter}
        if self.method_type == "reinforcement":
            settings = {"grader": self.grader, **settings}
        return {"type": self.method_type, self.method_type: settings}

    def with_derived(self, derived: dict[str, Any]) -> "JobSpec":
        return replace(self, derived_from=derived)

    def record(self) -> dict[str, Any]:
        """The JSON stored in `jobs.spec`."""
        out = asdict(self)
        out["warnings"] = list(self.warnings)
        out["integrations"] = list(self.integrations)
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "JobSpec":
        """Raises TypeError (a missing field) or ValueError (an unknown one) on a record that is not a spec."""
        known = {f.name for f in fields(cls)}
        unknown = set(record) - known - _DERIVED_KEYS
        if unknown:
            raise ValueError(f"job spec has unknown fields: {sorted(unknown)}")
        values = {k: v for k, v in record.items() if k in known}
        values["warnings"] = tuple(values.get("warnings") or ())
        values["integrations"] = tuple(values.get("integrations") or ())
        return cls(**values)
