"""The fine-tuning job, its events and checkpoints (openai-python `FineTuningJob`,
`FineTuningJobEvent`, `FineTuningJobCheckpoint`), plus the `gridline` extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

JobStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"]


class JobError(BaseModel):
    code: str
    """A fixed code from the reference's error table."""
    message: str
    """What happened and what to do; never row content."""
    param: str | None = None


class JobGridline(BaseModel):
    quote: dict[str, Any]
    """The quote at create: token bounds, time and cost estimates, `per_token` charge rules. Empty while a
    job created on a batch results file is distilling (`reason` `distilling`): it is quoted once distilled."""
    result: dict[str, Any] | None = None
    """After training: eval losses before and after, eval rows and source, train loss, steps, seconds, loss-mask report."""
    fine_tuned_adapter: dict[str, Any] | None = None
    """`{model, servable, reason}`: the adapter's `ft:` name, also on download-only bases."""
    derived_from: dict[str, Any] | None = None
    """When training_file was a batch results file: the files distilled from it and the counts."""
    reason: str | None = None
    """Why a job waits, when it does (`account_capacity`, `gridline_capacity`, `distilling`)."""
    charge: dict[str, Any] | None = None
    """Once a job that started under billing ends: `{usd, cents, basis, trained_tokens, trained_usd_per_mtok}`;
    basis is `trained_tokens`, `minimum`, `max_charge` or `not_charged`."""
    parent: dict[str, Any] | None = None
    """When `model` named an ft: model or checkpoint: `{model, fine_tuning_job_id, lora_rank, lora_alpha}`,
    the adapter this job's adapter starts from (`model` is then the parent's base)."""


class FineTuningJob(BaseModel):
    id: str
    """`ftjob-` followed by 32 hex characters."""
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobError | None = None
    fine_tuned_model: str | None = None
    """`ft:<base>:<org>:<job suffix>` once the adapter is stored and servable."""
    finished_at: int | None = None
    hyperparameters: dict[str, Any]
    """OpenAI's `n_epochs`, `batch_size`, `learning_rate_multiplier`, and Gridline's keys."""
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: JobStatus
    trained_tokens: int | None = None
    training_file: str
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[dict[str, Any]] = []
    """As created: `{"type": "wandb", "wandb": {project, entity, name, tags}}` (OpenAI's shape) or
    `{"type": "mlflow", "mlflow": {experiment, run_name, tags}}`; see jobs/integrations.py."""
    metadata: dict[str, str] | None = None
    method: dict[str, Any]
    user_provided_suffix: str | None = None
    gridline: JobGridline


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] = "message"


class CheckpointMetrics(BaseModel):
    step: float | None = None
    train_loss: float | None = None
    train_mean_token_accuracy: float | None = None
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None
    full_valid_loss: float | None = None
    full_valid_mean_token_accuracy: float | None = None
    valid_mean_reward: float | None = None
    """Reinforcement jobs: the mean grader reward on the validation prompts at this checkpoint (ours)."""


class FineTuningJobCheckpoint(BaseModel):
    id: str
    """`ftckpt_` followed by 24 hex characters."""
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int
