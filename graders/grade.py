"""`grade(grader, sample, item)` and `grade_many(grader, pairs)`: a `Grade(score, passed, details)`
per (sample, item).

- string_check: 1 or 0 (eq, ne; like: the reference occurs in the input; ilike: ignoring case);
- text_similarity: the metric (graders/similarity.py), passed at `pass_threshold`;
- python: the user's grade() in the sandbox (graders/sandbox.py), one process per grade;
- score_model / label_model: one `ModelCall` for every pair of a `grade_many` (a batch), each
  answer read as graders/model_graders.py says;
- multi: each of its graders over every pair, then `calculate_output` per pair.

Nothing the grader or its model does raises: a grade that cannot be had is 0 with a `reason` and
OpenAI's error flag (`details["errors"]`, the names of `GraderRunResponse.metadata.errors`).
`passed`: score >= pass_threshold when the grader has one; else a string check's 1, a label in
passing_labels, or a score at least halfway up its range ([0, 1] unless a score_model says).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graders import formula, sandbox, similarity
from graders.model_graders import ModelCall, parse_label, parse_score, request_for, score_range
from graders.models import (
    Grader,
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from graders.templates import render


@dataclass(frozen=True)
class Grade:
    score: float
    passed: bool
    details: dict = field(default_factory=dict)
    """reason (why the grade is 0, when it is for a failure), errors ({flag: True}), sub_scores
    (multi), usage ({model: {prompt_tokens, completion_tokens}}), label (label_model), seconds."""

    @property
    def reason(self) -> str | None:
        return self.details.get("reason")


@dataclass(frozen=True)
class Runtime:
    """What grading needs from outside: the model call (model graders) and the sandbox's limits."""

    model_call: ModelCall | None = None
    sandbox: sandbox.SandboxLimits = field(default_factory=sandbox.SandboxLimits)
    python: sandbox.PythonRuntime | None = None


def _failed(reason: str, flag: str, **extra) -> Grade:
    return Grade(0.0, False, {"reason": reason, "errors": {flag: True}, **extra})


def _midway(low: float, high: float) -> float:
    return low + (high - low) / 2


def grade(grader: Grader, sample: dict | None, item: Any, runtime: Runtime | None = None) -> Grade:
    return grade_many(grader, [(sample, item)], runtime)[0]


def grade_many(grader: Grader, pairs: Sequence[tuple[dict | None, Any]], runtime: Runtime | None = None) -> list[Grade]:
    runtime = runtime or Runtime()
    if isinstance(grader, MultiGrader):
        return _multi(grader, pairs, runtime)
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        return _model(grader, pairs, runtime)
    return [_one(grader, sample, item, runtime) for sample, item in pairs]


def _one(grader: Grader, sample: dict | None, item: Any, runtime: Runtime) -> Grade:
    if isinstance(grader, StringCheckGrader):
        text, reference = render(grader.input, sample, item), render(grader.reference, sample, item)
        ok = {"eq": text == reference, "ne": text != reference, "like": reference in text,
              "ilike": reference.casefold() in text.casefold()}[grader.operation]
        return Grade(1.0 if ok else 0.0, ok)
    if isinstance(grader, TextSimilarityGrader):
        text, reference = render(grader.input, sample, item), render(grader.reference, sample, item)
        try:
            value = similarity.score(grader.evaluation_metric, text, reference)
        except similarity.MetricUnavailable as exc:
            return _failed(str(exc), "other_error")
        threshold = grader.pass_threshold if grader.pass_threshold is not None else 0.5
        return Grade(value, value >= threshold)
    if isinstance(grader, PythonGrader):
        result = sandbox.run_python(grader.source, sample, item, runtime.sandbox, runtime.python)
        if result.score is None:
            flag = "python_grader_server_error" if result.error == "sandbox_unavailable" else "python_grader_runtime_error"
            return _failed(result.reason, flag, limit=result.limit, python_error=result.details, seconds=result.seconds)
        threshold = grader.pass_threshold if grader.pass_threshold is not None else 0.5
        return Grade(result.score, result.score >= threshold, {"seconds": result.seconds})
    raise TypeError(f"not a grader: {type(grader).__name__}")


def _model(grader: ScoreModelGrader | LabelModelGrader, pairs, runtime: Runtime) -> list[Grade]:
    if runtime.model_call is None:
        return [_failed("No model runs here to answer a model grader.", "model_grader_server_error")] * len(pairs)
    requests = [request_for(grader, sample, item) for sample, item in pairs]
    answers = runtime.model_call(requests)
    grades = []
    for answer in answers:
        usage = {grader.model: {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens}}
        if answer.text is None:
            grades.append(_failed(answer.error or "The grading model did not answer.", "model_grader_server_error",
                                  usage=usage))
            continue
        if isinstance(grader, ScoreModelGrader):
            low, high = score_range(grader)
            value, why = parse_score(answer.text, low, high)
            if value is None:
                grades.append(_failed(why, "model_grader_parse_error", usage=usage))
                continue
            threshold = grader.pass_threshold if grader.pass_threshold is not None else _midway(low, high)
            grades.append(Grade(value, value >= threshold, {"usage": usage}))
        else:
            label, why = parse_label(answer.text, grader.labels)
            if label is None:
                grades.append(_failed(why, "model_grader_parse_error", usage=usage))
                continue
            passed = label in grader.passing_labels
            grades.append(Grade(1.0 if passed else 0.0, passed, {"usage": usage, "label": label}))
    return grades


def _multi(grader: MultiGrader, pairs, runtime: Runtime) -> list[Grade]:
    parsed = formula.parse(grader.calculate_output, set(grader.graders))
    by_name = {name: grade_many(sub, pairs, runtime) for name, sub in grader.graders.items()}
    grades = []
    for i in range(len(pairs)):
        subs = {name: grades_[i] for name, grades_ in by_name.items()}
        errors: dict[str, bool] = {}
        usage: dict[str, dict] = {}
        for sub in subs.values():
            errors.update(sub.details.get("errors", {}))
            for model, counts in sub.details.get("usage", {}).items():
                total = usage.setdefault(model, {"prompt_tokens": 0, "completion_tokens": 0})
                total["prompt_tokens"] += counts["prompt_tokens"]
                total["completion_tokens"] += counts["completion_tokens"]
        details = {"sub_scores": {name: sub.score for name, sub in subs.items()}, "errors": errors, "usage": usage}
        reasons = [f"{name}: {sub.reason}" for name, sub in subs.items() if sub.reason]
        try:
            value = parsed.evaluate({name: sub.score for name, sub in subs.items()})
        except (ArithmeticError, ValueError):
            grades.append(Grade(0.0, False, {**details, "errors": {**errors, "other_error": True},
                                             "reason": "calculate_output has no value here (a division by zero, or a "
                                                       "square root or logarithm outside its domain)."}))
            continue
        if reasons:
            details["reason"] = "; ".join(reasons)
        grades.append(Grade(value, value >= 0.5, details))
    return grades
