"""One line of a batch input file read for running: a chat request for the engine, or the error line
it becomes. Used by pipelines/batch_ray.py on the driver; pure.

The create-time scan (batches/) refuses files it cannot run, but a line it let through must still
never crash a batch: every shape problem here is an error line with OpenAI's shape, naming the
field (never its value) in `param`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

URL = "/v1/chat/completions"
# Body fields a line may carry: the model's, the sampling ones the engine implements, and the ones
# that change nothing here (`user`, `metadata`, `store`).
ALLOWED_BODY = frozenset(
    ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n", "stream",
     "user", "metadata", "store")
)  # fmt: skip
_ROLES = ("system", "developer", "user", "assistant")
MESSAGE_KEYS = frozenset(("role", "content"))
MAX_STOP = 4  # OpenAI's limit on `stop` sequences


@dataclass(frozen=True)
class LineError:
    status_code: int
    code: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class Request:
    """A line that reads as a chat request; its model and prompt are checked on the driver next."""

    model: str
    messages: list[dict]
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class Line:
    line_no: int  # 1-based line of the file
    custom_id: str | None
    request: Request | None
    error: LineError | None


def _invalid(param: str, what: str) -> LineError:
    return LineError(400, "invalid_value", f"{param} {what}; fix the line.", param)


def parse_line(raw: bytes, line_no: int) -> Line:
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        row = None
    if not isinstance(row, dict):
        return Line(line_no, None, None, LineError(400, "invalid_json", f"line {line_no} is not a JSON object.", None))
    custom_id = row.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(line_no, None, None, _invalid("custom_id", "must be a non-empty string"))
    try:
        return Line(line_no, custom_id, _request(row), None)
    except _Refused as exc:
        return Line(line_no, custom_id, None, exc.error)


class _Refused(Exception):
    def __init__(self, error: LineError):
        self.error = error


class BodyRefused(Exception):
    """A chat request body a batch line could not run; `error.param` names the field as `body.<field>`."""

    def __init__(self, error: LineError):
        super().__init__(error.code)
        self.error = error


def check_body(body: dict) -> Request:
    """The body of a chat completion as a batch line's body is checked, field for field: the online
    route (serve_app/services/chat.py) takes what batch lines take and refuses what they refuse."""
    try:
        return _request({"method": "POST", "url": URL, "body": body})
    except _Refused as exc:
        raise BodyRefused(exc.error) from None


def _request(row: dict) -> Request:
    if row.get("method") != "POST":
        raise _Refused(_invalid("method", "must be POST"))
    if row.get("url") != URL:
        raise _Refused(_invalid("url", f"must be {URL}"))
    body = row.get("body")
    if not isinstance(body, dict):
        raise _Refused(_invalid("body", "must be a JSON object"))
    for name in body:
        if name not in ALLOWED_BODY:
            raise _Refused(_unsupported_field("body", name))
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _Refused(_invalid("body.model", "must be a model name"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Refused(_invalid("body.messages", "must be a non-empty list"))
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise _Refused(_invalid(f"body.messages[{i}]", "must be a system, user or assistant message with text content"))
        for name in m:  # `name` and the tool fields would change the prompt; dropping them would run another one
            if name not in MESSAGE_KEYS:
                raise _Refused(_unsupported_field(f"body.messages[{i}]", name))
    messages = [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]} for m in messages]
    n = body.get("n")
    if n is not None and not _is_int(n):  # true and 1.0 equal 1 in Python, but are not the integer 1
        raise _Refused(_invalid("body.n", "must be an integer"))
    if n not in (None, 1):
        raise _Refused(LineError(400, "unsupported_value", "body.n must be 1 in batches here.", "body.n"))
    if body.get("stream") not in (None, False):
        raise _Refused(LineError(400, "unsupported_value", "body.stream must be false in batches.", "body.stream"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise _Refused(_invalid(f"body.{name}", "must be an integer of at least 1"))
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise _Refused(_invalid("body.top_p", "must be above 0"))
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _Refused(_invalid("body.seed", "must be an integer"))
    stop = body.get("stop")
    stop = (stop,) if isinstance(stop, str) else stop if stop is not None else ()
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise _Refused(_invalid("body.stop", f"must be a string or a list of up to {MAX_STOP} non-empty strings"))
    return Request(model, messages, max_tokens, temperature, top_p, seed, tuple(stop))


def _unsupported_field(where: str, name: str) -> LineError:
    shown = name if name.isidentifier() and len(name) <= 64 else "a field"
    return LineError(400, "unsupported_field", f"{where}.{shown} is not supported in batches here; remove it.",
                     f"{where}.{shown}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _Refused(_invalid(f"body.{name}", f"must be a number from {low:g} to {high:g}"))
    return float(value)


def line_ids(batch_id: str, line_no: int) -> tuple[str, str, str]:
    """(line id, request id, completion id), derived from the batch and line rather than drawn at
    random, so that a batch run again writes the same bytes."""
    digest = hashlib.sha256(f"{batch_id}:{line_no}".encode()).hexdigest()
    return f"batch_req_{digest[:24]}", f"req_{digest[24:48]}", f"chatcmpl-{digest[48:64]}"


def error_line(batch_id: str, line: Line, error: LineError) -> dict:
    line_id, request_id, _ = line_ids(batch_id, line.line_no)
    kind = "invalid_request_error" if error.status_code < 500 else "server_error"
    body = {"error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}}
    return {"id": line_id, "custom_id": line.custom_id, "response": {"status_code": error.status_code,
            "request_id": request_id, "body": body}, "error": None}  # fmt: skip


def not_run_line(batch_id: str, line: Line, stopped: str) -> dict:
    line_id, _, _ = line_ids(batch_id, line.line_no)
    why = "the batch was cancelled" if stopped == "cancelled" else "the batch's completion window passed"
    return {"id": line_id, "custom_id": line.custom_id, "response": None,
            "error": {"code": f"batch_{stopped}", "message": f"This request was not run: {why}."}}  # fmt: skip


def output_line(batch_id: str, line: Line, model: str, created: int, result) -> dict:
    line_id, request_id, completion_id = line_ids(batch_id, line.line_no)
    usage = {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
             "total_tokens": result.prompt_tokens + result.completion_tokens}  # fmt: skip
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text, "refusal": None},
                     "finish_reason": result.finish_reason, "logprobs": None}],  # fmt: skip
        "usage": usage,
    }
    return {"id": line_id, "custom_id": line.custom_id, "response": {"status_code": 200, "request_id": request_id,
            "body": body}, "error": None}  # fmt: skip
