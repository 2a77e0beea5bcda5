"""score_model and label_model: the prompt each item gives the grading model, and how its answer
is read. The model call itself is injected (`ModelCall`): graders/ runs no model; the service
answers the requests with a model it runs (evals/runtime.py: the batch engine in a Ray task), tests with what they choose.

The request carries the form its answer must take (`answer`: a number in the grader's range, or one
of its labels), which the engine keeps decoding to (pipelines/answer_format.py), as OpenAI answers
its graders with structured output: a base that was never taught to grade still answers a grade.

Reading an answer, as OpenAI's structured output gives it (`{"result": ...}`), or plain (the form
above; an engine without the constraint may still answer otherwise):
- score_model: a JSON object with a numeric `result`, or an answer that is one number; it must lie
  in `range` ([0, 1] by default);
- label_model: a JSON object with a string `result`, or an answer that is one of `labels` (quotes,
  surrounding space and a final period ignored; case ignored when that picks one label).
Anything else is unparseable: the grade is 0 with the reason, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from graders.models import LabelModelGrader, ScoreModelGrader
from graders.templates import render

DEFAULT_MAX_TOKENS = 128
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class NumberAnswer:
    """The answer is one decimal number in [low, high] (a score_model grader's)."""

    low: float
    high: float


@dataclass(frozen=True)
class ChoiceAnswer:
    """The answer is one of `options` (a label_model grader's labels)."""

    options: tuple[str, ...]


@dataclass(frozen=True)
class ModelRequest:
    model: str  # a base id, an ft: model or a checkpoint name, as the grader names it
    messages: tuple[dict, ...]  # [{"role", "content"}], rendered
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0  # greedy unless the grader's sampling_params say otherwise: grades repeat
    top_p: float = 1.0
    seed: int | None = None
    answer: NumberAnswer | ChoiceAnswer | None = None  # the form decoding keeps the answer to


@dataclass(frozen=True)
class ModelAnswer:
    text: str | None  # None: the model could not answer (`error` says why)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class ModelCall(Protocol):
    def __call__(self, requests: Sequence[ModelRequest]) -> list[ModelAnswer]:
        """One answer per request, in order."""
        ...


def request_for(grader: ScoreModelGrader | LabelModelGrader, sample: dict | None, item: Any) -> ModelRequest:
    messages = tuple({"role": "system" if m.role == "developer" else m.role, "content": render(m.text(), sample, item)}
                     for m in grader.input)
    params = getattr(grader, "sampling_params", None)
    return ModelRequest(
        model=grader.model, messages=messages,
        max_tokens=(params.max_completions_tokens if params and params.max_completions_tokens else DEFAULT_MAX_TOKENS),
        temperature=params.temperature if params and params.temperature is not None else 0.0,
        top_p=params.top_p if params and params.top_p is not None else 1.0,
        seed=params.seed if params else None,
        answer=(ChoiceAnswer(tuple(grader.labels)) if isinstance(grader, LabelModelGrader)
                else NumberAnswer(*score_range(grader))),
    )


def score_range(grader: ScoreModelGrader) -> tuple[float, float]:
    """[low, high] of a score_model's answers: its `range`, [0, 1] when it has none."""
    low, high = grader.range or (0.0, 1.0)
    return float(low), float(high)


def _result_field(text: str) -> Any:
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed.get("result") if isinstance(parsed, dict) else parsed


def parse_score(text: str, low: float, high: float) -> tuple[float | None, str | None]:
    """(score, None) or (None, the reason it cannot be used)."""
    stripped = text.strip()
    value = _result_field(stripped)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        match = _NUMBER.fullmatch(stripped.rstrip("."))
        value = float(match[0]) if match else None
    if value is None or not math.isfinite(value):
        return None, "The grading model's answer is not a number."
    if not low <= value <= high:
        return None, f"The grading model's answer is outside the range [{low:g}, {high:g}]."
    return float(value), None


def parse_label(text: str, labels: Sequence[str]) -> tuple[str | None, str | None]:
    stripped = text.strip()
    value = _result_field(stripped)
    if not isinstance(value, str):
        value = stripped.strip("\"'` ").rstrip(".").strip()
    if value in labels:
        return value, None
    folded = [label for label in labels if label.casefold() == value.casefold()]
    if len(folded) == 1:
        return folded[0], None
    return None, "The grading model's answer is not one of the grader's labels."
