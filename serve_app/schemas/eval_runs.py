"""An eval run (openai-python `types/evals/run_retrieve_response.py`, whose siblings create, list and
cancel share its shape), its delete answer (`run_delete_response.py`) and its output items
(`types/evals/runs/output_item_retrieve_response.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ResultCounts(BaseModel):
    total: int
    """Items with a recorded outcome."""
    passed: int
    """Items every criterion passed."""
    failed: int
    """Items a criterion failed."""
    errored: int
    """Items with no sample (the request could not run: its sample's `error` says why)."""


class PerTestingCriteriaResult(BaseModel):
    testing_criteria: str
    """The criterion's name."""
    passed: int
    failed: int


class PerModelUsage(BaseModel):
    model_name: str
    """The sampled model, or a model grader's model."""
    invocation_count: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0
    """Always 0: nothing here caches prompts."""


class EvalAPIError(BaseModel):
    code: str
    message: str


class EvalRun(BaseModel):
    object: Literal["eval.run"] = "eval.run"
    id: str
    """`evalrun_` followed by 32 hex characters."""
    eval_id: str
    created_at: int
    """Unix seconds."""
    name: str
    model: str
    """The model sampled (a completions run); empty for a jsonl run."""
    status: str
    """queued, in_progress, completed, failed or canceled."""
    data_source: dict[str, Any]
    """As the run was created with (jsonl or completions)."""
    metadata: dict[str, str] | None = None
    result_counts: ResultCounts
    per_testing_criteria_results: list[PerTestingCriteriaResult]
    per_model_usage: list[PerModelUsage]
    report_url: str
    """The dashboard's page of the run."""
    error: EvalAPIError | None = None
    """Why the run failed (code and message), else null."""


class EvalRunDeleted(BaseModel):
    object: Literal["eval.run.deleted"] = "eval.run.deleted"
    deleted: bool
    run_id: str


class OutputItemResult(BaseModel, extra="allow"):
    name: str
    """The criterion's name."""
    type: str | None = None
    score: float
    passed: bool
    sample: dict[str, Any] | None = None
    reason: str | None = None
    """Why the grade is what it is when it is 0 for a failure (a limit, an unparseable answer)."""


class OutputItem(BaseModel):
    object: Literal["eval.run.output_item"] = "eval.run.output_item"
    id: str
    """`outputitem_` followed by 28 hex characters."""
    run_id: str
    eval_id: str
    created_at: int
    status: str
    """pass (every criterion passed), fail, or error (no sample: see sample.error)."""
    datasource_item_id: int
    """The item's index in the run's source."""
    datasource_item: dict[str, Any]
    results: list[OutputItemResult]
    sample: dict[str, Any] = Field(default_factory=dict)
    """OpenAI's sample: input, output, model, finish_reason, usage, error, sampling parameters."""


class ComparedCriterion(BaseModel):
    name: str
    graded: int
    """Items with a sample that this criterion graded."""
    pass_rate: float | None = None
    """Passed / graded (null when nothing was graded)."""
    mean_score: float | None = None


class ComparedRun(BaseModel):
    id: str
    model: str
    status: str
    result_counts: ResultCounts
    criteria: list[ComparedCriterion]
    per_model_usage: list[PerModelUsage]


class ChangedGrade(BaseModel):
    score: float
    passed: bool


class ChangedItem(BaseModel):
    datasource_item_id: int
    before: str
    """The item's status in the first run: pass, fail or error."""
    after: str
    criteria: dict[str, dict[str, ChangedGrade]]
    """Each criterion whose pass changed: {"before": {score, passed}, "after": {...}}."""
    datasource_item: dict[str, Any]


class EvalRunComparison(BaseModel):
    object: Literal["gridline.eval.comparison"] = "gridline.eval.comparison"
    eval_id: str
    runs: list[ComparedRun]
    """The two runs, in the order asked (`run_id` first, then `other_run_id`)."""
    changed: list[ChangedItem]
    """The items both runs recorded whose status or any criterion's pass differs, in item order."""
