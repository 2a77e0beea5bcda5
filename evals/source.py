"""A run's data source, checked at create: its type, its items and (completions) the model, the
input messages and the sampling, each refusal naming its param and never echoing the caller's
data. What it finds is the run's plan (evals/plan.py) and its items, which the service stores.

Rules (OpenAI's `CreateEvalJSONLRunDataSource` and `CreateEvalCompletionsRunDataSource`):
- `jsonl`: items that carry their samples (`{"item": {...}, "sample": {...}}`): grading only.
- `completions`: `model` (a base, or the caller's servable ft: model or checkpoint, resolved as a
  batch line's model: jobs/model_names.py), `input_messages` (a `template` of messages whose
  `{{item.*}}` references the eval's item schema must hold, or an `item_reference` to a list of
  messages in each item), `sampling_params` (max_completion_tokens, temperature, top_p, seed).
- `responses` is refused by name: nothing here stores responses.
- `source`: `file_content` (the items in the request) or `file_id` (the caller's JSONL file of
  purpose `evals`, read by the service's `read_file`, which answers its own refusals).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from batches.scan import tokens_upper_bound
from catalog.bases import BASES
from evals.plan import RunPlan, Sampling
from graders.templates import Scope, check
from jobs.model_names import ResolvedModel
from openft.errors import InvalidRequest, NotFound, unknown_parameter

P = "data_source"
MAX_ITEMS = 10_000
SOURCE_KEYS = {"file_content": ("type", "content"), "file_id": ("type", "id")}
SAMPLING_KEYS = ("max_completion_tokens", "temperature", "top_p", "seed")
MODEL_GRADERS = ("score_model", "label_model")


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


@dataclass(frozen=True)
class Found:
    plan: RunPlan
    items: list[dict]  # [{"item": {...}, "sample": {...}?}] in order


def _only(raw: dict, keys, param: str) -> None:
    for key in raw:
        if key not in keys:
            raise unknown_parameter(key, param)


def _items(raw, read_file: Callable[[str], bytes], with_samples: bool) -> list[dict]:
    param = f"{P}.source"
    if not isinstance(raw, dict):
        raise _invalid("data_source.source must be an object of type file_content or file_id.", param,
                       "missing_required_parameter" if raw is None else "invalid_value")
    kind = raw.get("type")
    if kind not in SOURCE_KEYS:
        raise _invalid("data_source.source.type must be file_content or file_id.", f"{param}.type")
    _only(raw, SOURCE_KEYS[kind], param)
    if kind == "file_content":
        rows = raw.get("content")
        if not isinstance(rows, list):
            raise _invalid("data_source.source.content must be a list of {\"item\": {...}} objects.", f"{param}.content")
        where = lambda i: f"{param}.content[{i}]"  # noqa: E731
    else:
        file_id = raw.get("id")
        if not isinstance(file_id, str) or not file_id:
            raise _invalid("data_source.source.id must be a file id.", f"{param}.id", "missing_required_parameter")
        rows = []
        for line_no, line in enumerate(read_file(file_id).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                raise InvalidRequest(f"Line {line_no} of data_source.source.id is not valid JSON.",
                                     code="invalid_json_line", param=f"{param}.id", line=line_no) from None
        where = lambda i: f"{param}.id"  # noqa: E731
    if not rows:
        raise _invalid("The run's source has no items.", f"{param}.content" if kind == "file_content" else f"{param}.id",
                       "empty_file")
    if len(rows) > MAX_ITEMS:
        raise _invalid(f"A run grades at most {MAX_ITEMS} items; split the source.", where(MAX_ITEMS))
    items = []
    for i, row in enumerate(rows):
        line = f" (item {i}, line {i + 1})" if kind == "file_id" else ""
        if not isinstance(row, dict) or not isinstance(row.get("item"), dict):
            raise _invalid(f"Each item of the source must be an object with an \"item\" object{line}.", where(i))
        extra = set(row) - {"item", "sample"}
        if extra:
            raise _invalid(f"An item of the source has keys other than item and sample{line}.", where(i))
        if with_samples and not isinstance(row.get("sample"), dict):
            raise _invalid(f"A jsonl run's items carry their sample: each needs a \"sample\" object{line}.", where(i))
        items.append({"item": row["item"], **({"sample": row["sample"]} if with_samples else {})})
    return items


def _number(raw: dict, key: str, low: float, high: float) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _invalid(f"data_source.sampling_params.{key} must be a number from {low:g} to {high:g}.",
                       f"{P}.sampling_params.{key}")
    return float(value)


def _sampling(raw: dict, resolved: ResolvedModel, item_schema: dict) -> Sampling:
    messages = raw.get("input_messages")
    param = f"{P}.input_messages"
    template, reference = None, None
    if not isinstance(messages, dict):
        raise _invalid("data_source.input_messages must be a template or an item_reference.", param,
                       "missing_required_parameter" if messages is None else "invalid_value")
    if messages.get("type") == "template":
        _only(messages, ("type", "template"), param)
        rows = messages.get("template")
        if not isinstance(rows, list) or not rows:
            raise _invalid("data_source.input_messages.template must be a non-empty list of messages.", f"{param}.template")
        template = []
        for i, m in enumerate(rows):
            at = f"{param}.template[{i}]"
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
                raise _invalid("Each message needs a role: system, developer, user or assistant.", f"{at}.role")
            _only(m, ("role", "content", "type"), at)
            if not isinstance(m.get("content"), str):
                raise _invalid("A message's content must be a string (text only here).", f"{at}.content")
            check(m["content"], f"{at}.content", Scope(item_schema=item_schema, sample=False))
            template.append({"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]})
    elif messages.get("type") == "item_reference":
        _only(messages, ("type", "item_reference"), param)
        reference = messages.get("item_reference")
        at = f"{param}.item_reference"
        if not isinstance(reference, str) or not reference.startswith("item."):
            raise _invalid("data_source.input_messages.item_reference names a list of messages in the item: item.<path>.",
                           at)
        check("{{" + reference + "}}", at, Scope(item_schema=item_schema, sample=False))
    else:
        raise _invalid("data_source.input_messages.type must be template or item_reference.", f"{param}.type")
    params = raw.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _invalid("data_source.sampling_params must be an object.", f"{P}.sampling_params")
    _only(params, SAMPLING_KEYS, f"{P}.sampling_params")
    max_tokens = params.get("max_completion_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise _invalid("data_source.sampling_params.max_completion_tokens must be a positive integer.",
                       f"{P}.sampling_params.max_completion_tokens")
    seed = params.get("seed")
    if seed is not None and type(seed) is not int:
        raise _invalid("data_source.sampling_params.seed must be an integer.", f"{P}.sampling_params.seed")
    temperature, top_p = _number(params, "temperature", 0, 2), _number(params, "top_p", 0, 1)
    return Sampling(model=resolved.name, base_id=resolved.base_id, model_kind=resolved.kind,
                    template=tuple(template) if template is not None else None, item_reference=reference,
                    max_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
                    top_p=1.0 if top_p is None else top_p, seed=seed)


def _model(raw: dict, resolve: Callable[[str], ResolvedModel | None]) -> ResolvedModel:
    name = raw.get("model")
    if not isinstance(name, str) or not name:
        raise _invalid("data_source.model names the model to sample: a base, or one of your ft: models or checkpoints.",
                       f"{P}.model", "missing_required_parameter")
    resolved = resolve(name)
    if resolved is None:
        raise NotFound("data_source.model does not name a model you can use: a base, or one of your ft: models or "
                       "checkpoints.", code="model_not_found", param=f"{P}.model")
    if not resolved.servable:
        raise _invalid(f"data_source.model cannot answer prompts here: {resolved.reason or 'it is not servable.'}",
                       f"{P}.model", "model_not_available")
    return resolved


def model_grader_bases(criteria: list[dict], resolve: Callable[[str], ResolvedModel | None]) -> list[str]:
    """The base of each model-graded criterion's model (one per request an item makes), multi's included."""
    out = []
    for criterion in criteria:
        subs = criterion["graders"].values() if criterion["type"] == "multi" else [criterion]
        for sub in subs:
            if sub["type"] in MODEL_GRADERS:
                found = resolve(sub["model"])
                if found is not None:  # deleted since the eval: its grades are 0 with their reason, and cost nothing
                    out.append(found.base_id)
    return out


def parse(raw, *, item_schema: dict, criteria: list[dict], resolve: Callable[[str], ResolvedModel | None],
          read_file: Callable[[str], bytes], rate: Callable[[str], float]) -> Found:
    if not isinstance(raw, dict):
        raise _invalid("Missing data_source.", P, "missing_required_parameter")
    kind = raw.get("type")
    if kind == "responses":
        raise _invalid("data_source.type responses reads stored responses, and this service stores none; use "
                       "completions (sampled here) or jsonl.", f"{P}.type", "unsupported_value")
    if kind not in ("jsonl", "completions"):
        raise _invalid("data_source.type must be jsonl or completions.", f"{P}.type",
                       "missing_required_parameter" if kind is None else "invalid_value")
    allowed = ("type", "source") if kind == "jsonl" else ("type", "source", "model", "input_messages", "sampling_params")
    _only(raw, allowed, P)
    sampling = None
    if kind == "completions":
        resolved = _model(raw, resolve)
        sampling = _sampling(raw, resolved, item_schema)
    items = _items(raw.get("source"), read_file, with_samples=kind == "jsonl")
    bound, bases = 0, model_grader_bases(criteria, resolve)
    if sampling is not None:
        for row in items:
            messages = sampling.template or ()
            prompt_bytes = len(orjson.dumps(row["item"])) + sum(len(m["content"].encode()) for m in messages)
            bound += tokens_upper_bound(sampling.base_id, prompt_bytes, max(len(messages), 1), sampling.max_tokens)
    bound += sum(BASES[base].max_seq_length for base in bases) * len(items)
    charged = ([sampling.base_id] if sampling else []) + bases
    rate_base = max(charged, key=rate) if charged else None  # the dearest: the charge never exceeds the hold
    return Found(RunPlan(kind=kind, items=len(items), sampling=sampling, tokens_upper_bound=bound,
                         rate_base_id=rate_base), items)
