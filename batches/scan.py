"""The create-time scan of a batch's input file: every line's shape, unique custom_ids, and the
models the lines name, resolved once (jobs/model_names.py `resolve_model`).

Where it sits: batch create (serve_app/services/batches.py) runs it before anything is created;
a refusal is `400` with `param` input_file_id and the line number (`error.line`), never a line's
content. What it returns becomes the batch's `plan` (batches/plan.py; the worker runs the batch from it).

Rules (the reference's "Your ft: model": one base, alone or with up to 8 of its ft: models):
- Each line is a JSON object `{custom_id, method: "POST", url: "/v1/chat/completions", body:
  {model, messages, ...}}`, custom_id a non-empty string, unique in the file. The body's other
  fields are checked per line when the batch runs (an unsupported field becomes an error line).
- The models that can run (a servable base, the caller's servable ft: and checkpoint models) all
  share one base, and at most 8 are not the base itself; the line that names a second base or a
  ninth fine-tune is refused.
- A model that cannot run is not a refusal of the batch: its lines go to the error file with the
  code the API answers for that model (`refused`): unknown, another account's or deleted ones
  404 model_not_found; download-only or not-servable ones 400 model_not_available.
- Blank lines are skipped (they are not requests); a file with no request is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import orjson

from batches.plan import Plan, PlannedModel
from catalog.bases import BASES
from jobs.model_names import ResolvedModel
from openft.errors import InvalidRequest
from pipelines.batch_plan import LineRefusal

MAX_FINE_TUNES = 8
MAX_DISTINCT_NAMES = 64  # resolving a name reads the database: a file naming more is refused
PARAM = "input_file_id"


def refusal(code: str, line: int, why: str) -> InvalidRequest:
    return InvalidRequest(f"Line {line} of input_file_id {why}", code=code, param=PARAM, line=line)


@dataclass
class ScanResult:
    base_id: str
    models: list[dict]  # [{"name", "kind", "adapter_prefix"}]: the runnable ones, the base first when named
    refused: dict[str, dict]  # body.model -> {"status_code", "code", "message"}
    lines: int
    tokens_upper_bound: int  # every line's prompt bytes + template overhead + max tokens, each at most the context
    custom_ids_sample: list[str] = field(default_factory=list)

    def plan(self) -> Plan:
        return Plan(base_id=self.base_id, models=tuple(PlannedModel(**m) for m in self.models),
                    refused_models={name: LineRefusal(**r) for name, r in self.refused.items()}, lines=self.lines,
                    tokens_upper_bound=self.tokens_upper_bound)


def tokens_upper_bound(base_id: str, prompt_bytes: int, messages: int, max_tokens: int | None) -> int:
    """One request's most tokens (the quote's rule, batches/billing.py): its prompt's UTF-8 bytes (a
    token is at least one byte) plus the template's overhead, plus its max tokens, at most the context."""
    base = BASES[base_id]
    prompt = prompt_bytes + messages * base.message_overhead_tokens + base.row_overhead_tokens
    return min(base.max_seq_length, prompt + (max_tokens or base.max_seq_length))


def _refused_for(resolved: ResolvedModel | None) -> dict | None:
    if resolved is None:
        return {"status_code": 404, "code": "model_not_found",
                "message": "The model named in body.model does not exist or you do not have access to it."}
    if not resolved.servable:
        why = resolved.reason or "This model cannot run in a batch."
        return {"status_code": 400, "code": "model_not_available", "message": why}
    return None


def _check_line(raw: bytes, line: int, endpoint: str) -> tuple[str, str, dict]:
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise refusal("invalid_json_line", line, "is not valid JSON.") from None
    if not isinstance(row, dict):
        raise refusal("invalid_json_line", line, "is not a JSON object.")
    custom_id = row.get("custom_id")
    if type(custom_id) is not str or not custom_id:
        raise refusal("missing_custom_id", line, "needs a non-empty string custom_id.")
    if row.get("method") != "POST":
        raise refusal("invalid_method", line, 'needs method "POST".')
    if row.get("url") != endpoint:
        raise refusal("mismatched_endpoint", line, f"needs url {endpoint}, the batch's endpoint.")
    body = row.get("body")
    if not isinstance(body, dict):
        raise refusal("missing_required_parameter", line, "needs a body object.")
    model = body.get("model")
    if type(model) is not str or not model:
        raise refusal("missing_required_parameter", line, "needs body.model, a model name.")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise refusal("missing_required_parameter", line, "needs body.messages, a non-empty list.")
    return custom_id, model, body


def _max_tokens(body: dict) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if type(value) is int and value > 0:
            return value
    return None


def scan(lines: Iterable[bytes], resolve: Callable[[str], ResolvedModel | None], *,
         endpoint: str = "/v1/chat/completions") -> ScanResult:
    seen: set[str] = set()
    resolved: dict[str, ResolvedModel | None] = {}
    refused: dict[str, dict] = {}
    base_id: str | None = None
    fine_tunes: list[str] = []
    named_base = False
    per_line: list[tuple[int, int, int | None]] = []  # (prompt bytes, messages, max tokens) of runnable lines
    count = 0
    for line, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        custom_id, model, body = _check_line(raw, line, endpoint)
        if custom_id in seen:
            raise refusal("duplicate_custom_id", line, "repeats a custom_id of an earlier line; each must be unique.")
        seen.add(custom_id)
        count += 1
        if model not in resolved:
            if len(resolved) >= MAX_DISTINCT_NAMES:
                raise refusal("too_many_models", line, f"names more than {MAX_DISTINCT_NAMES} different models; a "
                              f"batch runs one base and at most {MAX_FINE_TUNES} of its fine-tunes.")
            resolved[model] = resolve(model)
            why = _refused_for(resolved[model])
            if why is not None:
                refused[model] = why
            else:
                found = resolved[model]
                if base_id is None:
                    base_id = found.base_id
                elif found.base_id != base_id:
                    raise refusal("mixed_bases", line, f"names a model of another base than the earlier lines "
                                  f"({base_id}); one batch runs one base and its fine-tunes: split the file by base.")
                if found.kind == "base":
                    named_base = True
                else:
                    fine_tunes.append(model)
                    if len(fine_tunes) > MAX_FINE_TUNES:
                        raise refusal("too_many_models", line, f"names a {len(fine_tunes)}th fine-tuned model of "
                                      f"{base_id}; one batch runs at most {MAX_FINE_TUNES}: split the file.")
        if model not in refused:
            per_line.append((len(orjson.dumps(body["messages"])), len(body["messages"]), _max_tokens(body)))
    if count == 0:
        raise InvalidRequest("input_file_id has no request line.", code="empty_file", param=PARAM)
    if base_id is None:
        raise InvalidRequest(
            "No line of input_file_id names a model that can run in a batch (each line's error would be "
            "model_not_found or model_not_available); name a base or one of your ft: models.",
            code="model_not_found", param=PARAM)
    bound = sum(tokens_upper_bound(base_id, *line) for line in per_line)
    models = [{"name": base_id, "kind": "base", "adapter_prefix": None}] if named_base else []
    models += [{"name": n, "kind": resolved[n].kind, "adapter_prefix": resolved[n].adapter_prefix} for n in fine_tunes]
    return ScanResult(base_id=base_id, models=models, refused=refused, lines=count, tokens_upper_bound=bound)
