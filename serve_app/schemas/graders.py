"""The grader endpoints' responses (openai-python `types/fine_tuning/alpha/grader_run_response.py`,
`grader_validate_response.py`), field for field, plus `gridline` on a run: whether the grade
passed and why it is 0 when a failure made it so."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class GraderRunErrors(BaseModel):
    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    """The grading model's answer was not a number in range (score_model) or not a label (label_model)."""
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    """The grading model could not answer (its prompt does not fit, it ran past its time)."""
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    """The python grader raised, returned no number, or broke a sandbox limit."""
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False


class GraderRunMetadata(BaseModel):
    errors: GraderRunErrors
    execution_time: float
    """Seconds the grade took."""
    name: str
    sampled_model_name: str | None = None
    scores: dict[str, Any]
    """The grader's score by name; a multi grader's sub-graders' too."""
    token_usage: int | None = None
    """Tokens the grading models read and wrote (model graders only)."""
    type: str


class GraderRunGridline(BaseModel):
    passed: bool
    """Whether the grade passes: at the grader's pass_threshold, else as graders/grade.py says."""
    reason: str | None = None
    """Why the grade is 0 when a failure made it so (a sandbox limit, an unparseable answer)."""


class GraderRunResponse(BaseModel):
    metadata: GraderRunMetadata
    model_grader_token_usage_per_model: dict[str, Any]
    reward: float
    sub_rewards: dict[str, Any]
    gridline: GraderRunGridline


class GraderValidateResponse(BaseModel):
    grader: dict[str, Any] | None = None
    """The grader as validated (fields left out stay out)."""
