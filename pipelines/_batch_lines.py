"""One batch line, OpenAI or Anthropic, read for distillation: a request's prompt, a result's answer.

`pipelines/distill.py` applies the file-level rules and builds rows from what these return;
both the local and the Ray Data path call them line by line. A line that is no batch line of
either format raises `BadLine` (fixed text, no content). A request the Files API could not hold
becomes `Unconvertible(why)`, `why` naming the field as an upload refusal would; a result's
answer comes back with its drop reason, "" when it can be trained on.

Conversion rules:
- OpenAI `developer` is the newer name of `system`; either is allowed as the first message only.
- Text content parts (OpenAI) and text blocks (Anthropic, also `system`) are joined with a blank
  line; `cache_control` and `citations` on a text block are annotations and are not kept. Any
  other part or block (images, audio, files, documents, tool use, thinking) is unconvertible,
  as are tools, tool_choice, `name`, tool calls and the tool and function roles.
- An answer: OpenAI's first choice's `content`; Anthropic's text blocks concatenated (they are
  consecutive pieces of one text), thinking blocks left out (the chat format has no place for
  them). finish_reason `length` and stop_reason `max_tokens`, `model_context_window_exceeded`
  or `pause_turn` are truncated; `content_filter`, `refusal` or a `refusal` field are refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from pipelines._rows import MAX_MESSAGES, REFUSED_MESSAGE_FIELDS, REFUSED_ROW_FIELDS

OPENAI, ANTHROPIC = "openai", "anthropic"
_ANTHROPIC_RESULT_TYPES = ("succeeded", "errored", "canceled", "expired")
_OPENAI_TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call")
_ANTHROPIC_TOOL_FIELDS = ("tools", "tool_choice", "mcp_servers", "container")
_TEXT_BLOCK_ANNOTATIONS = frozenset(("type", "text", "cache_control", "citations"))
# Part and block types that may be named in a reason; any other is "a content part outside the format".
_KNOWN_PARTS = frozenset(
    (
        "image_url", "input_audio", "file", "refusal", "image", "document", "tool_use", "tool_result",
        "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "search_result",
        "container_upload",
    )
)  # fmt: skip
_NAMEABLE = frozenset(REFUSED_ROW_FIELDS + REFUSED_MESSAGE_FIELDS + _OPENAI_TOOL_FIELDS + _ANTHROPIC_TOOL_FIELDS)


class BadLine(Exception):
    """The line is not a batch line of either format; `detail` is fixed text."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class Unconvertible(NamedTuple):
    why: str  # a field or type name from the formats, never content


class Prompt(NamedTuple):
    messages_json: bytes  # the row's messages before the answer, as a JSON list
    prefill: str | None = None  # an Anthropic prefill: the answer continues it


class _Refuse(Exception):
    def __init__(self, why: str):
        self.why = why


def _load(line: bytes) -> dict:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = None  # raised below, outside the handler: the decode error holds the line's text
    if type(obj) is not dict:
        raise BadLine("the line is not a JSON object; each line of a batch file is one JSON object.")
    custom_id = obj.get("custom_id")
    if type(custom_id) is not str or not custom_id:
        raise BadLine("the line needs a non-empty string 'custom_id'.")
    return obj


def _given(value: Any) -> bool:
    return value is not None and value != [] and value != {} and value != ""


def _name(key: str) -> str:
    return key if key in _NAMEABLE else "a field outside the format"


def _text(content: Any, allowed: frozenset) -> str:
    """A message's content as one string: a string, or a list of text parts joined by a blank line."""
    if type(content) is str:
        text = content
    elif type(content) is list:
        texts = []
        for part in content:
            kind = part.get("type") if type(part) is dict else None
            if kind != "text":
                raise _Refuse(kind if kind in _KNOWN_PARTS else "a content part outside the format")
            if type(part.get("text")) is not str or any(_given(v) for k, v in part.items() if k not in allowed):
                raise _Refuse("a content part outside the format")
            texts.append(part["text"])
        text = "\n\n".join(texts)
    else:
        raise _Refuse("content")
    if not text:
        raise _Refuse("empty content")
    return text


def _message(role: str, content: str) -> dict[str, Any]:
    # Earlier assistant turns are the prompt's context; only the distilled answer trains.
    return {"role": role, "content": content, "weight": 0} if role == "assistant" else {"role": role, "content": content}


def _openai_messages(obj: dict) -> list[dict[str, Any]]:
    url = obj.get("url")
    if url is not None and url != "/v1/chat/completions":
        raise _Refuse("url")
    body = obj["body"]
    for key in _OPENAI_TOOL_FIELDS:
        if _given(body.get(key)) and body.get(key) != "none":
            raise _Refuse(key)
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        raise _Refuse("messages")
    out = []
    for i, m in enumerate(messages):
        if type(m) is not dict:
            raise _Refuse("messages")
        role = m.get("role")
        role = "system" if role == "developer" else role
        if role in ("tool", "function"):
            raise _Refuse(f"role {role}")
        if role not in ("system", "user", "assistant"):
            raise _Refuse("role")
        if role == "system" and i:
            raise _Refuse("a system message after the first")
        for key, value in m.items():
            if key not in ("role", "content") and _given(value):
                raise _Refuse(_name(key))
        out.append(_message(role, _text(m.get("content"), frozenset(("type", "text")))))
    return out


def _anthropic_messages(obj: dict) -> tuple[list[dict[str, Any]], str | None]:
    params = obj["params"]
    for key in _ANTHROPIC_TOOL_FIELDS:
        if _given(params.get(key)):
            raise _Refuse(key)
    out = []
    if _given(params.get("system")):
        out.append({"role": "system", "content": _text(params["system"], _TEXT_BLOCK_ANNOTATIONS)})
    messages = params.get("messages")
    if type(messages) is not list or not messages:
        raise _Refuse("messages")
    for m in messages:
        if type(m) is not dict:
            raise _Refuse("messages")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise _Refuse("role")
        if any(key not in ("role", "content") for key in m):
            raise _Refuse(_name(next(key for key in m if key not in ("role", "content"))))
        out.append(_message(role, _text(m.get("content"), _TEXT_BLOCK_ANNOTATIONS)))
    prefill = None
    if out[-1]["role"] == "assistant":
        prefill = out.pop()["content"]
    return out, prefill


def parse_request(line: bytes) -> tuple[str, str, Prompt | Unconvertible]:
    """(custom_id, format, the prompt or why it cannot be one); raises BadLine."""
    obj = _load(line)
    if type(obj.get("body")) is dict and "params" not in obj:
        fmt, convert = OPENAI, lambda o: (_openai_messages(o), None)
    elif type(obj.get("params")) is dict and "body" not in obj:
        fmt, convert = ANTHROPIC, _anthropic_messages
    else:
        raise BadLine(
            "the line is neither an OpenAI batch request (custom_id, body) nor an Anthropic one (custom_id, params)."
        )
    try:
        messages, prefill = convert(obj)
    except _Refuse as refused:
        return obj["custom_id"], fmt, Unconvertible(refused.why)
    if len(messages) + 1 > MAX_MESSAGES:
        return obj["custom_id"], fmt, Unconvertible("more than 1,024 messages")
    return obj["custom_id"], fmt, Prompt(orjson.dumps(messages), prefill)


def _openai_answer(obj: dict, keep_truncated: bool) -> tuple[str, str]:
    response = obj.get("response")
    if _given(obj.get("error")) or type(response) is not dict or response.get("status_code") != 200:
        return "", "errored"
    body = response.get("body")
    choices = body.get("choices") if type(body) is dict else None
    if type(choices) is not list:
        return "", "not_convertible"
    if not choices:
        return "", "empty"
    choice = choices[0]
    message = choice.get("message") if type(choice) is dict else None
    if type(message) is not dict:
        return "", "not_convertible"
    finish = choice.get("finish_reason")
    if _given(message.get("refusal")) or finish == "content_filter":
        return "", "refused"
    if finish in ("tool_calls", "function_call") or any(_given(message.get(k)) for k in ("tool_calls", "function_call", "audio")):
        return "", "not_convertible"
    content = message.get("content")
    if content is not None and type(content) is not str:
        return "", "not_convertible"
    return _finish(content or "", finish == "length", keep_truncated)


def _anthropic_answer(obj: dict, keep_truncated: bool) -> tuple[str, str]:
    result = obj["result"]
    if result["type"] != "succeeded":
        return "", "errored"
    message = result.get("message")
    if type(message) is not dict or type(message.get("content")) is not list:
        return "", "not_convertible"
    stop = message.get("stop_reason")
    if stop == "refusal":
        return "", "refused"
    texts = []
    for block in message["content"]:
        kind = block.get("type") if type(block) is dict else None
        if kind == "text" and type(block.get("text")) is str:
            texts.append(block["text"])
        elif kind not in ("thinking", "redacted_thinking"):
            return "", "not_convertible"
    if stop == "tool_use":
        return "", "not_convertible"
    truncated = stop in ("max_tokens", "model_context_window_exceeded", "pause_turn")
    return _finish("".join(texts), truncated, keep_truncated)


def _finish(answer: str, truncated: bool, keep_truncated: bool) -> tuple[str, str]:
    if truncated and not keep_truncated:
        return "", "truncated"
    if not answer.strip():
        return "", "empty"
    return answer, ""


def parse_result(line: bytes, keep_truncated: bool) -> tuple[str, str, str, str]:
    """(custom_id, format, answer, drop reason or ""); raises BadLine."""
    obj = _load(line)
    if "response" in obj and "result" not in obj:
        if obj["response"] is not None and type(obj["response"]) is not dict:
            raise BadLine("an OpenAI batch result's 'response' must be an object or null.")
        answer, reason = _openai_answer(obj, keep_truncated)
        return obj["custom_id"], OPENAI, answer, reason
    if "result" in obj and "response" not in obj:
        result = obj["result"]
        if type(result) is not dict or result.get("type") not in _ANTHROPIC_RESULT_TYPES:
            raise BadLine("an Anthropic batch result's 'result.type' must be succeeded, errored, canceled or expired.")
        answer, reason = _anthropic_answer(obj, keep_truncated)
        return obj["custom_id"], ANTHROPIC, answer, reason
    raise BadLine(
        "the line is neither an OpenAI batch result (custom_id, response, error) nor an Anthropic one (custom_id, result)."
    )
