"""The per-line rules of uploaded files, as pure functions of one line's bytes.

`pipelines/validate.py` splits a file into lines and calls `check_line_bytes` on each, both
inline during an upload and inside the Ray Data tasks of `pipelines/validate_ray.py`, so both
paths report the same first error. A rule that fails raises `FileValidationError` without a line
number; the caller adds it. Messages are built from fixed text, positions and the field names
listed here: never from the row, not even a key we do not know (a key can hold user data).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from orjson import JSONDecodeError, loads

from openft.errors import InvalidRequest

MAX_LINE_BYTES = 1 << 20
MAX_MESSAGES = 1024

ROLES = ("system", "user", "assistant")
REFUSED_ROLES = ("tool", "function")
REFUSED_ROW_FIELDS = ("tools", "functions", "parallel_tool_calls")
REFUSED_MESSAGE_FIELDS = ("name", "tool_calls", "function_call", "tool_call_id", "refusal", "audio")
MESSAGE_KEYS = frozenset(("role", "content", "weight"))
OUTPUT_KEYS = frozenset(("role", "content"))
CHAT_KEYS = frozenset(("messages",))
PREFERENCE_KEYS = frozenset(("input", "preferred_output", "non_preferred_output"))
INPUT_KEYS = frozenset(("messages",))
# The only keys a message may name; anything else is "a field outside the format".
_NAMEABLE = (
    MESSAGE_KEYS | CHAT_KEYS | PREFERENCE_KEYS | {"custom_id"} | set(REFUSED_ROW_FIELDS) | set(REFUSED_MESSAGE_FIELDS)
)
LINE_TOO_LARGE = "the line is over 1 MiB (1,048,576 bytes); shorten or drop the conversation."
EMPTY_FILE = "the file is empty; upload at least one row."
_PARTS = "send the text as one string."
_BOM = b"\xef\xbb\xbf"
_NOT_JSON = object()


class FileValidationError(InvalidRequest):
    """The first invalid line of a file (or a whole-file rule): a fixed code, a line, no content."""

    def __init__(self, code: str, detail: str, line: int | None = None):
        self.detail = detail
        self.line = line
        super().__init__(f"line {line}: {detail}" if line is not None else detail, code=code, param="file")

    def at(self, line: int) -> FileValidationError:
        return FileValidationError(self.code, self.detail, line)

    def __reduce__(self):
        return FileValidationError, (self.code, self.detail, self.line)


class LineInfo(NamedTuple):
    kind: str | None  # "chat" | "preference" | "reinforcement"; None for batch lines
    messages: int
    content_bytes: int


_BATCH_LINE = LineInfo(None, 0, 0)


def _fail(code: str, detail: str) -> FileValidationError:
    return FileValidationError(code, detail)


def _name(key: str) -> str:
    return f"'{key}'" if key in _NAMEABLE else "a field outside the format"


def _unsupported_key(obj: dict, allowed: frozenset, where: str) -> FileValidationError:
    key = next(k for k in obj if k not in allowed)
    if key in REFUSED_ROW_FIELDS or key in REFUSED_MESSAGE_FIELDS:
        why = "tools, function calling and their fields are not supported; remove it."
    else:
        why = f"allowed here: {', '.join(sorted(allowed))}."
    return _fail("unsupported_field", f"{where} has {_name(key)}, which is not supported; {why}")


def too_long(n: int, last_byte: int) -> bool:
    """Whether a line of `n` bytes (without its newline) ending in `last_byte` is over the limit."""
    # A \r\n line ending is accepted: its \r is not counted against the limit.
    return n > MAX_LINE_BYTES and not (n == MAX_LINE_BYTES + 1 and last_byte == 13)


def line_too_large(line: bytes) -> bool:
    return len(line) > MAX_LINE_BYTES and too_long(len(line), line[-1])


def _parse(line: bytes) -> dict:
    if line_too_large(line):
        raise _fail("line_too_large", LINE_TOO_LARGE)
    try:
        row = loads(line)
    except JSONDecodeError:
        row = _NOT_JSON  # raised below, outside the handler: the decode error holds the line's text
    if row is _NOT_JSON:
        if not line or line == b"\r":
            raise _fail("invalid_json", "the line is empty; remove blank lines (one newline may end the file).")
        if line.startswith(_BOM):
            raise _fail("invalid_json", "the line starts with a byte-order mark (U+FEFF); save the file as UTF-8 without BOM.")
        raise _fail("invalid_json", "the line is not valid JSON; each line must be one JSON object.")
    if type(row) is not dict:
        raise _fail("invalid_json", "the line is JSON but not an object; each line must be one JSON object.")
    return row


def _at(where: str, i: int) -> str:
    return f"{where} message {i}" if where else f"message {i}"


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _check_message(m: Any, where: str, i: int, code: str) -> tuple[str, int, int]:
    """One message's rules, in the order their errors are reported; returns (role, weight, content bytes)."""
    if type(m) is not dict:
        raise _fail(code, f"{_at(where, i)} is not a JSON object.")
    role = m.get("role")
    if role in REFUSED_ROLES:
        raise _fail(
            "unsupported_field",
            f"{_at(where, i)} has role '{role}', which is not supported; the tool and function roles are refused.",
        )
    if type(role) is not str or role not in ROLES:
        raise _fail(code, f"{_at(where, i)} needs a role of system, user or assistant.")
    if not m.keys() <= MESSAGE_KEYS:
        raise _unsupported_key(m, MESSAGE_KEYS, _at(where, i))
    content = m.get("content")
    if type(content) is list:
        raise _fail("unsupported_field", f"{_at(where, i)} has content parts (a list), which are not supported; {_PARTS}")
    if type(content) is not str or not content:
        raise _fail(code, f"{_at(where, i)} needs non-empty string content.")
    if role == "system" and i != 1:
        raise _fail(code, f"{_at(where, i)} is a system message; only the first message may be one.")
    weight = m.get("weight", 1)
    if "weight" in m and role != "assistant":
        raise _fail(code, f"{_at(where, i)} has a weight; only assistant messages carry one.")
    if type(weight) is not int or weight not in (0, 1):
        raise _fail(code, f"{_at(where, i)} has a weight that is not 0 or 1.")
    return role, weight, _utf8_len(content)


def _check_messages(messages: list, where: str, code: str) -> tuple[int, bool, bool, str]:
    """Message rules shared by chat rows and preference inputs.

    Returns (content bytes, has an assistant message, has one with weight 1, last role).
    """
    content_bytes = 0
    assistant = trained = False
    role = ""
    for i, m in enumerate(messages, 1):
        # Fast path for the usual {"role", "content"} message; all else takes the ordered checks.
        if type(m) is dict and len(m) == 2:
            content = m.get("content")
            if type(content) is str and content:
                role = m.get("role")
                if role == "assistant" or role == "user" or (role == "system" and i == 1):
                    content_bytes += len(content) if content.isascii() else len(content.encode())
                    if role == "assistant":
                        assistant = trained = True
                    continue
        role, weight, nbytes = _check_message(m, where, i, code)
        content_bytes += nbytes
        if role == "assistant":
            assistant = True
            trained = trained or weight == 1
    return content_bytes, assistant, trained, role


def _row_messages(row: dict) -> tuple[int, int, bool, str]:
    """A chat or reinforcement row's `messages`: (count, content bytes, has one of weight 1, last role)."""
    messages = row["messages"]
    if type(messages) is not list or not messages:
        raise _fail("invalid_messages", "'messages' must be a non-empty list of message objects.")
    if len(messages) > MAX_MESSAGES:
        raise _fail("too_many_messages", "the row has more than 1,024 messages; split the conversation.")
    content_bytes, _, trained, last_role = _check_messages(messages, "", "invalid_messages")
    return len(messages), content_bytes, trained, last_role


def _check_chat(row: dict) -> LineInfo:
    """Called for rows that name an assistant message (`check_fine_tune_line`)."""
    if len(row) != 1:
        raise _unsupported_key(row, CHAT_KEYS, "the row")
    count, content_bytes, trained, _ = _row_messages(row)
    if not trained:
        raise _fail("invalid_messages", "every assistant message has weight 0; give at least one weight 1 to train on.")
    return LineInfo("chat", count, content_bytes)


def _check_output(row: dict, field: str) -> str:
    out = row[field]
    if type(out) is not list or len(out) != 1 or type(out[0]) is not dict:
        raise _fail("invalid_preference_row", f"'{field}' must be a list of exactly one assistant message.")
    m = out[0]
    role = m.get("role")
    if role in REFUSED_ROLES:
        raise _fail("unsupported_field", f"'{field}' has role '{role}', which is not supported; use an assistant message.")
    if role != "assistant":
        raise _fail("invalid_preference_row", f"'{field}' must be one assistant message.")
    if not m.keys() <= OUTPUT_KEYS:
        raise _unsupported_key(m, OUTPUT_KEYS, f"'{field}'")
    content = m.get("content")
    if type(content) is list:
        raise _fail("unsupported_field", f"'{field}' has content parts (a list), which are not supported; {_PARTS}")
    if type(content) is not str or not content:
        raise _fail("invalid_preference_row", f"'{field}' needs non-empty string content.")
    return content


def _check_preference(row: dict) -> LineInfo:
    if not row.keys() <= PREFERENCE_KEYS:
        raise _unsupported_key(row, PREFERENCE_KEYS, "the row")
    for field in ("input", "preferred_output", "non_preferred_output"):
        if field not in row:
            raise _fail("invalid_preference_row", f"the preference row has no '{field}'.")
    inp = row["input"]
    if type(inp) is not dict or "messages" not in inp:
        raise _fail("invalid_preference_row", "'input' must be an object holding a 'messages' list.")
    if not inp.keys() <= INPUT_KEYS:
        raise _unsupported_key(inp, INPUT_KEYS, "'input'")
    messages = inp["messages"]
    if type(messages) is not list or not messages:
        raise _fail("invalid_preference_row", "'input.messages' must be a non-empty list of message objects.")
    if len(messages) + 2 > MAX_MESSAGES:
        raise _fail("too_many_messages", "the row has over 1,024 messages (input and outputs); shorten the prompt.")
    content_bytes, _, _, last_role = _check_messages(messages, "input.messages", "invalid_preference_row")
    if last_role != "user":
        raise _fail("invalid_preference_row", "'input.messages' must end with a user message.")
    preferred = _check_output(row, "preferred_output")
    non_preferred = _check_output(row, "non_preferred_output")
    if preferred == non_preferred:
        raise _fail("invalid_preference_row", "'preferred_output' and 'non_preferred_output' are equal; they must differ.")
    return LineInfo("preference", len(messages) + 2, content_bytes + _utf8_len(preferred) + _utf8_len(non_preferred))


def _names_assistant(messages: Any) -> bool:
    return type(messages) is list and any(type(m) is dict and m.get("role") == "assistant" for m in messages)


def _check_reinforcement(row: dict) -> LineInfo:
    """OpenAI's reinforcement row: `messages` is the prompt (ending with a user turn, no assistant
    turn to imitate) and any other top-level field is the grader's `{{item.<field>}}`. Only the
    tool fields stay refused, as in chat rows: nothing here runs tools."""
    for key in row:
        if key in REFUSED_ROW_FIELDS:
            raise _unsupported_key({key: None}, frozenset({"messages"}), "the row")
    count, content_bytes, _, last_role = _row_messages(row)
    if last_role != "user":
        if len(row) == 1:
            raise _fail("invalid_messages", "the row has no assistant message (a chat row needs one to train on) and "
                                            "does not end with a user message (a reinforcement row's prompt does).")
        raise _fail("invalid_reinforcement_row", "a reinforcement row's messages are the prompt: they end with a user "
                                                 "message.")
    return LineInfo("reinforcement", count, content_bytes)


def check_fine_tune_line(line: bytes) -> LineInfo:
    """A row's kind is its shape: `messages` with an assistant turn is chat (only `messages`), without
    one it is a reinforcement prompt (other fields allowed); `input` and the two outputs, preference."""
    row = _parse(line)
    if "messages" in row:
        return _check_chat(row) if _names_assistant(row["messages"]) else _check_reinforcement(row)
    if "input" in row or "preferred_output" in row or "non_preferred_output" in row:
        return _check_preference(row)
    raise _fail("invalid_messages", "the row has no 'messages' list (chat or reinforcement) nor 'input' (preference).")


def check_batch_line(line: bytes) -> LineInfo:
    row = _parse(line)
    custom_id: Any = row.get("custom_id")
    if type(custom_id) is not str or not custom_id:
        raise _fail("invalid_batch_line", "the line needs a non-empty string 'custom_id'.")
    return _BATCH_LINE


EVAL_KEYS = frozenset(("item", "sample"))


def check_eval_line(line: bytes) -> LineInfo:
    """An `evals` file's line (OpenAI's jsonl data source): {"item": {...}}, and for runs that only
    grade, the model's answer as "sample" (an object, e.g. {"output_text": ...}, or a string)."""
    row = _parse(line)
    if not row.keys() <= EVAL_KEYS:
        raise _unsupported_key(row, EVAL_KEYS, "the line")
    if type(row.get("item")) is not dict:
        raise _fail("invalid_eval_line", "the line needs an 'item' object: {\"item\": {...}}.")
    if "sample" in row and type(row["sample"]) not in (dict, str):
        raise _fail("invalid_eval_line", "'sample' must be an object (e.g. {\"output_text\": ...}) or a string.")
    return _BATCH_LINE


LINE_CHECKS = {"fine-tune": check_fine_tune_line, "batch": check_batch_line, "batch_output": check_batch_line,
               "evals": check_eval_line}
