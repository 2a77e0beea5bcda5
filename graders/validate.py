"""`validate(raw, param, rules)`: a grader from a request body, or the first refusal, as a 400
whose `param` is the path of what is refused (`grader.graders.name.operation`,
`testing_criteria[1].evaluation_metric`). Refused by name: an unknown field, grader type,
operation or metric, `cosine` (no embedding model in the catalog), image and audio inputs, a
multi grader inside a multi grader, a template reference to anything missing, a formula that
names no grader, a python source over the limit or without `grade`, a model the caller cannot
use (the service's `check_model`). Messages never echo the caller's values, only names of ours
(and the caller's own short names: a template reference, a formula's variable)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from graders import formula
from graders.models import (
    TYPES,
    Grader,
    LabelModelGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from graders.templates import Reference, Scope, check, references
from openft.errors import InvalidRequest, unknown_parameter

MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit on a python grader's source
_TEXT_ONLY = ("input_image", "input_audio")


@dataclass(frozen=True)
class Rules:
    """What a grader is checked against, beyond its own shape."""

    scope: Scope = field(default_factory=Scope)
    check_model: Callable[[str, str], None] | None = None
    """(model name, param): raises the refusal for a model the caller cannot use; None: not checked."""
    embedding_models: tuple[str, ...] = ()
    """Models `cosine` could embed with; the catalog has none, so cosine is refused."""
    max_source_bytes: int = MAX_SOURCE_BYTES
    require_pass_threshold: bool = False
    """An eval's text_similarity criterion must say its pass_threshold (OpenAI's type requires it)."""


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def validate(raw, param: str = "grader", rules: Rules | None = None, *, nested: bool = False) -> Grader:
    rules = rules or Rules()
    if not isinstance(raw, dict):
        raise _invalid(f"{param} must be a grader object.", param)
    kind = raw.get("type")
    if kind is None:
        raise _invalid(f"{param}.type is required: one of " + ", ".join(TYPES) + ".", f"{param}.type",
                       "missing_required_parameter")
    if not isinstance(kind, str) or kind not in TYPES:
        raise _invalid(f"{param}.type is not a grader type; use one of " + ", ".join(TYPES) + ".", f"{param}.type")
    if kind == "multi" and nested:
        raise _invalid(f"{param} is a multi grader inside a multi grader; multi graders do not nest: list its graders "
                       "in the outer one.", f"{param}.type")
    model = TYPES[kind]
    for key in raw:
        if key not in model.model_fields:
            raise unknown_parameter(key, param)
    if kind == "multi":
        return _multi(raw, param, rules)
    messages = raw.get("input") if kind in ("score_model", "label_model") else None
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        _refuse_media(message, f"{param}.input[{i}]")
    grader = _parse(model, raw, param)
    _check(grader, param, rules)
    return grader


def record(grader: Grader) -> dict:
    """The grader as JSON, fields the caller left out left out: what `validate` reads back unchanged."""
    if isinstance(grader, MultiGrader):
        return {"type": "multi", "name": grader.name, "calculate_output": grader.calculate_output,
                "graders": {k: record(g) for k, g in grader.graders.items()}}
    return grader.model_dump(exclude_none=True)


def item_references(grader: Grader, param: str = "grader") -> list[tuple[Reference, str]]:
    """Every `{{item.<path>}}` the grader's templates name, with the param of the field it is in.
    A python grader reads the item in its own code, so it names none."""
    if isinstance(grader, MultiGrader):
        return [found for key, sub in grader.graders.items()
                for found in item_references(sub, f"{param}.graders.{key}")]
    fields: list[tuple[str, str]] = []
    if isinstance(grader, (StringCheckGrader, TextSimilarityGrader)):
        fields = [(grader.input, f"{param}.input"), (grader.reference, f"{param}.reference")]
    elif isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        fields = [(m.text(), f"{param}.input[{i}].content") for i, m in enumerate(grader.input)]
    return [(ref, where) for text, where in fields for ref in references(text, where) if ref.namespace == "item"]


def _parse(model, raw: dict, param: str):
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        # Union branches add their class names to the path: keep the field names and indices.
        loc = [p for p in first["loc"] if isinstance(p, int) or p in _FIELD_NAMES]
        where = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        if first["type"] == "missing":
            raise _invalid(f"{where} is required.", where, "missing_required_parameter") from None
        if first["type"] == "extra_forbidden":
            raise unknown_parameter(str(first["loc"][-1]), where.rsplit(".", 1)[0]) from None
        if first["type"] == "literal_error":
            allowed = first.get("ctx", {}).get("expected", "")
            raise _invalid(f"{where} is not supported here; use {allowed}.", where) from None
        raise _invalid(f"{where}: {first['msg']}.", where) from None


_FIELD_NAMES = {name for m in (*TYPES.values(),) for name in m.model_fields} | {
    "role", "content", "text", "max_completions_tokens", "reasoning_effort", "seed", "temperature", "top_p"}


def _refuse_media(message, param: str) -> None:
    content = message.get("content") if isinstance(message, dict) else None
    parts = content if isinstance(content, list) else [content]
    for j, part in enumerate(parts):
        if isinstance(part, dict) and part.get("type") in _TEXT_ONLY:
            where = f"{param}.content[{j}]" if isinstance(content, list) else f"{param}.content"
            raise _invalid(f"{where} is {part['type']}, which is not supported: the models here read text only.",
                           f"{where}.type", "unsupported_value")


def _multi(raw: dict, param: str, rules: Rules) -> MultiGrader:
    for key in ("name", "graders", "calculate_output"):
        if key not in raw:
            raise _invalid(f"{param}.{key} is required.", f"{param}.{key}", "missing_required_parameter")
    graders = raw["graders"]
    if isinstance(graders, dict) and isinstance(graders.get("type"), str):
        # The SDK's type: one grader, read by its name.
        graders = {graders.get("name") if isinstance(graders.get("name"), str) else "grader": graders}
    if not isinstance(graders, dict) or not graders:
        raise _invalid(f"{param}.graders must be a non-empty object of graders by name.", f"{param}.graders")
    parsed = {key: validate(sub, f"{param}.graders.{key}", rules, nested=True) for key, sub in graders.items()}
    if not isinstance(raw["calculate_output"], str):
        raise _invalid(f"{param}.calculate_output must be a string.", f"{param}.calculate_output")
    formula.parse_param(raw["calculate_output"], set(parsed), f"{param}.calculate_output")
    if not isinstance(raw["name"], str):
        raise _invalid(f"{param}.name must be a string.", f"{param}.name")
    return MultiGrader.model_construct(type="multi", name=raw["name"], graders=parsed,
                                       calculate_output=raw["calculate_output"])


def _check(grader: Grader, param: str, rules: Rules) -> None:
    scope = rules.scope
    if isinstance(grader, (StringCheckGrader, TextSimilarityGrader)):
        check(grader.input, f"{param}.input", scope)
        check(grader.reference, f"{param}.reference", scope)
    if isinstance(grader, TextSimilarityGrader):
        if grader.evaluation_metric == "cosine" and not rules.embedding_models:
            raise _invalid(f"{param}.evaluation_metric cosine needs an embedding model, and the catalog has none; use "
                           "fuzzy_match, bleu, gleu, meteor or rouge_*.", f"{param}.evaluation_metric",
                           "unsupported_value")
        if rules.require_pass_threshold and grader.pass_threshold is None:
            raise _invalid(f"{param}.pass_threshold is required.", f"{param}.pass_threshold",
                           "missing_required_parameter")
    if isinstance(grader, PythonGrader):
        _check_source(grader.source, f"{param}.source", rules.max_source_bytes)
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        if not grader.input:
            raise _invalid(f"{param}.input must hold at least one message.", f"{param}.input")
        for i, message in enumerate(grader.input):
            check(message.text(), f"{param}.input[{i}].content", scope)
        if rules.check_model is not None:
            rules.check_model(grader.model, f"{param}.model")
    if isinstance(grader, ScoreModelGrader) and grader.range is not None:
        if len(grader.range) != 2 or not grader.range[0] < grader.range[1]:
            raise _invalid(f"{param}.range must be two numbers, the lower first.", f"{param}.range")
    if isinstance(grader, LabelModelGrader):
        if not grader.labels or len(set(grader.labels)) != len(grader.labels):
            raise _invalid(f"{param}.labels must be distinct labels, at least one.", f"{param}.labels")
        if not grader.passing_labels or not set(grader.passing_labels) <= set(grader.labels):
            raise _invalid(f"{param}.passing_labels must be a non-empty subset of labels.", f"{param}.passing_labels")


def _check_source(source: str, param: str, limit: int) -> None:
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise _invalid(f"{param} is {size:,} bytes, over the {limit:,}-byte limit for a python grader; shorten it.",
                       param, "source_too_large")
    try:
        # Parsing runs nothing of the caller's; it only finds whether `grade` is defined.
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _invalid(f"{param} is not valid Python source.", param, "invalid_source") from None
    defined = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "grade"
                  for node in tree.body)
    if not defined:
        raise _invalid(f"{param} must define a top-level function grade(sample, item) returning a number.", param,
                       "invalid_source")
