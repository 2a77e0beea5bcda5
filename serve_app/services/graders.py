"""The grader endpoints (`/v1/fine_tuning/alpha/graders/validate` and `/run`), as the SDK calls
them: validate a grader, or grade one model sample of one item with it. The rules are graders/';
this module supplies the caller's runtime (evals/runtime.py: their models on the batch engine, the
sandbox's limits from settings, as an eval run's grades get them) and OpenAI's response shape."""

from __future__ import annotations

from typing import Any

from graders import Grade, Grader, Rules, Runtime, Scope, grade, sample_namespace, validate
from graders.validate import record
from evals import runtime as grading
from openft.errors import InvalidRequest, unknown_parameter
from serve_app.schemas.graders import (
    GraderRunErrors,
    GraderRunGridline,
    GraderRunMetadata,
    GraderRunResponse,
    GraderValidateResponse,
)
from serve_app.state import AppState
from storage.models import Account


def runtime(state: AppState, account: Account) -> Runtime:
    return grading.runtime(state.db, tuple(state.store.spec()), state.settings, account.id)


def rules(state: AppState, account: Account, scope: Scope, **extra) -> Rules:
    return Rules(scope=scope, check_model=grading.model_checker(state.db, account.id), **extra)


def _only(body: dict, keys: tuple[str, ...]) -> None:
    for key in body:
        if key not in keys:
            raise unknown_parameter(key)
    if "grader" not in body:
        raise InvalidRequest("Missing grader.", code="missing_required_parameter", param="grader")


def validate_grader(state: AppState, account: Account, body: dict) -> GraderValidateResponse:
    _only(body, ("grader",))
    grader = validate(body["grader"], "grader", rules(state, account, Scope()))
    return GraderValidateResponse(grader=record(grader))


def run_grader(state: AppState, account: Account, body: dict) -> GraderRunResponse:
    _only(body, ("grader", "model_sample", "item"))
    sample_text = body.get("model_sample")
    if sample_text is None:
        raise InvalidRequest("Missing model_sample.", code="missing_required_parameter", param="model_sample")
    if not isinstance(sample_text, str):
        raise InvalidRequest("model_sample must be a string: the model's answer.", code="invalid_value",
                             param="model_sample")
    item = body.get("item", {})
    grader = validate(body["grader"], "grader", rules(state, account, Scope(item=item)))
    result = grade(grader, sample_namespace(sample_text), item, runtime(state, account))
    return run_response(grader, result)


def run_response(grader: Grader, result: Grade) -> GraderRunResponse:
    details: dict[str, Any] = result.details
    flags = details.get("errors", {})
    errors = GraderRunErrors(**{k: True for k in flags if k in GraderRunErrors.model_fields})
    if errors.python_grader_runtime_error:
        errors.python_grader_runtime_error_details = details.get("reason")
    if errors.model_grader_server_error or errors.model_grader_parse_error:
        errors.model_grader_server_error_details = details.get("reason")
    if errors.python_grader_server_error:
        errors.python_grader_server_error_type = "sandbox_unavailable"
    usage = details.get("usage", {})
    tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage.values()) if usage else None
    sub = details.get("sub_scores", {})
    return GraderRunResponse(
        reward=result.score, sub_rewards=sub, model_grader_token_usage_per_model=usage,
        metadata=GraderRunMetadata(errors=errors, execution_time=round(details.get("seconds", 0.0), 3), name=grader.name,
                                   scores={grader.name: result.score, **sub}, token_usage=tokens, type=grader.type),
        gridline=GraderRunGridline(passed=result.passed, reason=result.reason),
    )
