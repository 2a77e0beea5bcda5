"""What a tracker is given: the job's facts at start, and how the job ended.

Where it sits: train/integrations/forwarder.py builds both from the job row (the database is the
source of truth) and hands them to each tracker; nothing here holds a user's data (no rows, no
prompts), only ids, the base, the method and its settings, figures and codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.spec import JobSpec


@dataclass(frozen=True)
class JobFacts:
    job_id: str
    model: str
    config: dict[str, Any]  # hyperparameters and the method: the run's config / params

    @classmethod
    def of(cls, job_id: str, spec: JobSpec) -> "JobFacts":
        config = {
            "job_id": job_id, "model": spec.model, "method": spec.method_type, "adapter": spec.adapter,
            "seed": spec.seed, "training_file": spec.training_file, "validation_file": spec.validation_file,
            **spec.hyperparameters_wire(),
        }
        return cls(job_id=job_id, model=spec.model, config=config)

    def default_tags(self) -> list[str]:
        """Like OpenAI's `openai/finetune`, `openai/{base-model}`, `openai/{ftjob-...}`."""
        return ["openft/finetune", f"openft/{self.model}", f"openft/{self.job_id}"]


@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded | failed | cancelled
    trained_tokens: int | None
    fine_tuned_model: str | None
    error_code: str | None
    figures: dict[str, float] = field(default_factory=dict)  # the result's numbers (eval_loss, steps, ...)

    def summary(self) -> dict[str, Any]:
        """The run's closing values: `status`, `trained_tokens`, `fine_tuned_model`, `error_code`,
        and `result/<name>` for each figure."""
        return {"status": self.status, "trained_tokens": self.trained_tokens, "fine_tuned_model": self.fine_tuned_model,
                "error_code": self.error_code, **{f"result/{k}": v for k, v in self.figures.items()}}


def numbers(data: dict[str, Any] | None, *, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The finite int/float values of an event's or a result's data (never bools or strings)."""
    out = {}
    for key, value in (data or {}).items():
        if key in skip or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value == value and value not in (float("inf"), float("-inf")):
            out[key] = float(value)
    return out
