"""Hypothesis strategies for uploaded JSONL files, and the size edges built by repetition.

A generated file is a few lines, each a well-formed row (chat, preference or batch) or one of
the faults the upload rules are about: truncated JSON, invalid UTF-8, a byte-order mark (at the
file's start or on a later line), raw NUL bytes, deep nesting, huge numbers, duplicate keys,
values of the wrong type, unknown keys, blank lines and lines that are JSON but not objects.
Message texts mix arbitrary Unicode with the bases' control tokens. Every file carries MARKER,
which must never come back in a response.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
from hypothesis import assume
from hypothesis import strategies as st

from catalog.bases import HARMONY_CONTROL, LLAMA_CONTROL, MISTRAL_CONTROL, QWEN_CONTROL
from pipelines._rows import MAX_LINE_BYTES

MARKER = "QZ7FUZZMARKER"
MIB = 1 << 20
CONTROL_TOKENS = tuple(dict.fromkeys(QWEN_CONTROL + LLAMA_CONTROL + MISTRAL_CONTROL + HARMONY_CONTROL))
# Characters that have tripped JSON and text handling elsewhere: NUL, BOM, line separators, CR.
_ODD_CHARS = ("\x00", "\ufeff", "\u2028", "\u2029", "\r", "\n", "\t", "\x7f", "\U0010ffff", '"', "\\")
_BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xe2\x82", b"\xc0\xaf")
_BOM = b"\xef\xbb\xbf"
_NUMBERS = (
    b"1" * 19, b"1" * 20, b"1" * 400, b"9" * 5000, b"18446744073709551616", b"9223372036854775808",
    b"-9223372036854775809", b"1e400", b"-1e400", b"1E-400", b"0.1e99999", b"1.0", b"-0", b"0",
    b"01", b"NaN", b"Infinity", b"-Infinity", b"1" + b"0" * 310 + b".5",
)
_DEPTHS = (2, 64, 255, 256, 511, 512, 1023, 1024, 1025, 4096, 100_000)
_RAW_LINES = (b"", b"\r", b" ", b"[]", b"{}", b"null", b"1", b"true", b'"' + MARKER.encode() + b'"', b"\x00", MARKER.encode())
_HOLE = "\x01HOLE\x01"  # a JSON value to be replaced by raw bytes after serializing
_HOLE_BYTES = orjson.dumps(_HOLE)
_KEY_TAIL = st.text(max_size=4)


@dataclass
class GeneratedFile:
    purpose: str
    data: bytes
    kinds: list[str] = field(default_factory=list)  # what each line is: "chat", "truncated", ...


# Strategies are built once, and texts come mostly from a fixed pool: each draw costs Hypothesis
# time, and on a busy 2-core machine drawing every character cost more than the uploads.
_TEXT_POOL = tuple(MARKER + t for t in ("", "Hello.", *CONTROL_TOKENS, *_ODD_CHARS)) + tuple(
    f"{MARKER} {a}{b} x" for a, b in zip(CONTROL_TOKENS, _ODD_CHARS * 4)
)
TEXTS = st.one_of(st.sampled_from(_TEXT_POOL), st.text(max_size=10).map(lambda t: MARKER + t))
WRONG_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False),
    TEXTS, st.just([]), st.just({}), st.lists(st.integers(0, 9), max_size=2),
    st.just([{"type": "text", "text": MARKER}]), st.just({"role": "user", "content": MARKER}),
)
_LINE_KINDS = st.sampled_from(
    ["valid"] * 16 + ["truncated", "invalid_utf8", "bom", "nul", "deep", "huge_number", "duplicate_key", "wrong_type",
                     "unknown_key", "raw", "whitespace"]
)


@st.composite
def _messages(draw, *, end_with_user: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": draw(TEXTS)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 2))):
        messages.append({"role": "user", "content": draw(TEXTS)})
        assistant = {"role": "assistant", "content": draw(TEXTS)}
        if draw(st.integers(0, 5)) == 0:
            assistant["weight"] = draw(st.integers(0, 1))
        messages.append(assistant)
    if end_with_user:
        messages.append({"role": "user", "content": draw(TEXTS)})
    return messages


_MESSAGES, _PROMPT_MESSAGES = _messages(), _messages(end_with_user=True)


@st.composite
def chat_rows(draw) -> dict:
    return {"messages": draw(_MESSAGES)}


@st.composite
def preference_rows(draw) -> dict:
    preferred, other = draw(TEXTS), draw(TEXTS)
    return {
        "input": {"messages": draw(_PROMPT_MESSAGES)},
        "preferred_output": [{"role": "assistant", "content": preferred}],
        "non_preferred_output": [{"role": "assistant", "content": other + "!"}],
    }


@st.composite
def batch_lines(draw) -> dict:
    return {
        "custom_id": draw(TEXTS),
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": draw(_MESSAGES), "max_tokens": draw(st.integers(1, 4096))},
    }


_ROWS = {
    "fine-tune": st.one_of(chat_rows(), chat_rows(), preference_rows()),
    "batch": batch_lines(),
    "batch_output": batch_lines(),
}


def _pick(draw, options):
    return options[draw(st.integers(0, len(options) - 1))]


def _slots(obj, out: list) -> list:
    """Every (container, key) inside a row, to put a faulty value in."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        out.append((obj, key))
        _slots(value, out)
    return out


def _dicts(obj) -> list[dict]:
    return [c for c, _ in _slots(obj, []) if isinstance(c, dict)] + ([obj] if isinstance(obj, dict) else [])


@st.composite
def lines(draw, purpose: str) -> tuple[str, bytes]:
    """One line without its newline: (its kind, its bytes)."""
    row = draw(_ROWS[purpose])
    kind = draw(_LINE_KINDS)
    if kind in ("deep", "huge_number", "wrong_type"):
        container, key = _pick(draw, _slots(row, []))
        container[key] = _HOLE if kind != "wrong_type" else draw(WRONG_VALUES)
    elif kind == "unknown_key":
        _pick(draw, _dicts(row))[MARKER + draw(_KEY_TAIL)] = draw(WRONG_VALUES)
    line = orjson.dumps(row)
    if kind == "deep":
        depth, opener = _pick(draw, _DEPTHS), _pick(draw, (b"[", b'{"a":'))
        closer = b"]" if opener == b"[" else b"}"
        inner = b"1" if opener != b"[" else b""
        line = line.replace(_HOLE_BYTES, opener * depth + inner + closer * depth)
    elif kind == "huge_number":
        line = line.replace(_HOLE_BYTES, _pick(draw, _NUMBERS))
    elif kind == "truncated":
        line = line[: draw(st.integers(0, len(line) - 1))]
    elif kind in ("invalid_utf8", "nul"):
        at = draw(st.integers(0, len(line)))
        line = line[:at] + (_pick(draw, _BAD_UTF8) if kind == "invalid_utf8" else b"\x00") + line[at:]
    elif kind == "bom":
        line = _BOM + line
    elif kind == "duplicate_key":
        key = orjson.dumps(_pick(draw, sorted(row)))
        other = orjson.dumps(draw(WRONG_VALUES))
        # The faulty value first (the row's own value wins in most parsers) or last (it wins).
        line = (b"{" + key + b":" + other + b"," + line[1:]) if draw(st.booleans()) else (
            line[:-1] + b"," + key + b":" + other + b"}")
    elif kind == "raw":
        line = _pick(draw, _RAW_LINES)
    elif kind == "whitespace":
        line = b" \t" + line + b" "
    return kind, line


@st.composite
def jsonl_files(draw, purposes: tuple[str, ...] = ("fine-tune", "batch")) -> GeneratedFile:
    purpose = _pick(draw, purposes)
    drawn = draw(st.lists(lines(purpose), min_size=1, max_size=6))
    ending = _pick(draw, (b"\n", b"\n", b"\r\n"))
    data = ending.join(line for _, line in drawn)
    data += _pick(draw, (ending, ending, b"", ending * 2))
    if draw(st.integers(0, 15)) == 0:
        data = _BOM + data
    assume(MARKER.encode() in data)  # planted in every file
    return GeneratedFile(purpose, data, [kind for kind, _ in drawn])


def sized_line(n: int, purpose: str = "fine-tune", end: bytes = b"") -> bytes:
    """A valid row of exactly `n` bytes (without its newline), padded in its text; `end` replaces
    its last bytes (b"\\r": a CRLF ending counted in the line)."""
    if purpose == "fine-tune":
        row = {"messages": [{"role": "user", "content": MARKER}, {"role": "assistant", "content": "ok"}]}
        text = row["messages"][0]
    else:
        row = {"custom_id": MARKER, "method": "POST", "url": "/v1/chat/completions", "body": {}}
        text = row
    key = "content" if purpose == "fine-tune" else "custom_id"
    pad = n - len(end) - len(orjson.dumps(row))
    assert pad >= 0, n
    text[key] += "a" * pad
    line = orjson.dumps(row) + end
    assert len(line) == n
    return line


def size_edges(large: bool) -> list[tuple[str, str, bytes, str]]:
    """(label, purpose, data, expected outcome) on each side of the 1 MiB line limit and, when
    `large`, of the 64 MiB fine-tune file limit."""
    ok, too_long = "accepted", "line_too_large"
    cases = []
    for purpose in ("fine-tune", "batch"):
        filler = sized_line(200, purpose) + b"\n"
        cases += [
            (f"{purpose} line of 1 MiB", purpose, sized_line(MAX_LINE_BYTES, purpose) + b"\n", ok),
            (f"{purpose} line of 1 MiB + 1", purpose, sized_line(MAX_LINE_BYTES + 1, purpose) + b"\n", too_long),
            (f"{purpose} line of 1 MiB + CR", purpose, sized_line(MAX_LINE_BYTES + 1, purpose, b"\r") + b"\n", ok),
            (f"{purpose} line of 1 MiB + 1 + CR", purpose, sized_line(MAX_LINE_BYTES + 2, purpose, b"\r") + b"\n",
             too_long),
            (f"{purpose} last line of 1 MiB + 1, no newline", purpose,
             filler * 3 + sized_line(MAX_LINE_BYTES + 1, purpose), too_long),
        ]
    filler = sized_line(200) + b"\n"
    cases.append(("line 3 of 1 MiB + 1", "fine-tune", filler * 2 + sized_line(MAX_LINE_BYTES + 1) + b"\n" + filler,
                  too_long))
    if large:
        block = sized_line(MIB // 16 - 1) + b"\n"  # 64 KiB with its newline: 1,024 of them are 64 MiB
        batch_block = sized_line(MIB // 16 - 1, "batch") + b"\n"
        cases += [
            ("fine-tune file of 64 MiB", "fine-tune", block * 1024, ok),
            ("fine-tune file of 64 MiB + 1", "fine-tune", block * 1023 + sized_line(MIB // 16) + b"\n",
             "file_too_large"),
            ("fine-tune file of 64 MiB, last line cut", "fine-tune", block * 1023 + block[:-2] + b"\n", "invalid_json"),
            ("batch file of 64 MiB + 1", "batch", batch_block * 1023 + sized_line(MIB // 16, "batch") + b"\n", ok),
        ]
    return cases


def explicit_files() -> list[GeneratedFile]:
    """Cases every run tries first, whatever Hypothesis draws."""
    chat = orjson.dumps({"messages": [{"role": "user", "content": MARKER}, {"role": "assistant", "content": "ok"}]})
    batch = orjson.dumps({"custom_id": MARKER, "method": "POST", "url": "/v1/chat/completions", "body": {}})
    tokens = orjson.dumps({"messages": [{"role": "user", "content": MARKER + "".join(CONTROL_TOKENS)},
                                        {"role": "assistant", "content": "<|im_end|><|eot_id|></s>"}]})
    deep = chat.replace(b'"ok"', b"[" * 100_000 + b"]" * 100_000)
    return [
        GeneratedFile("fine-tune", b"", ["empty"]),
        GeneratedFile("fine-tune", b"\n", ["blank"]),
        GeneratedFile("fine-tune", _BOM, ["bom"]),
        GeneratedFile("fine-tune", _BOM + chat + b"\n", ["bom"]),
        GeneratedFile("fine-tune", (chat + b"\n") * 4 + _BOM + chat + b"\n", ["valid", "bom"]),
        GeneratedFile("batch", (batch + b"\n") * 4 + _BOM + batch + b"\n", ["valid", "bom"]),
        GeneratedFile("fine-tune", chat + b"\n\x00\n", ["valid", "nul"]),
        GeneratedFile("fine-tune", tokens + b"\r\n" + tokens, ["valid"]),
        GeneratedFile("fine-tune", chat + b"\n" + deep + b"\n", ["valid", "deep"]),
        GeneratedFile("fine-tune", chat.replace(b'"ok"}', b'"ok","weight":' + b"9" * 5000 + b"}") + b"\n", ["huge_number"]),
        GeneratedFile("batch", batch[:-1] + b',"custom_id":7}\n', ["duplicate_key"]),
        GeneratedFile("fine-tune", chat[:-1] + b',"messages":[]}\n', ["duplicate_key"]),
    ]
