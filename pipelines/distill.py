"""Distillation rules: a batch's requests and results (OpenAI or Anthropic format) -> chat rows.

`POST /v1/files/distill` runs these rules through the Ray Data pipeline in
`pipelines/distill_ray.py`; `distill_local` is the same rules in one process (the benchmark's
baseline and the tests' oracle: both give byte-identical files). The per-line conversion lives in
`pipelines/_batch_lines.py`. A row is the request's messages plus the answer as the last,
trained assistant turn, in the training-file format `pipelines/validate.check_line` accepts.

Decisions:
- Format: detected per line, the file's format is its first line's; a line of the other format
  (`mixed_formats`), a line of neither (`invalid_file_format`) or a custom_id already seen in
  the same file (`duplicate_custom_id`: both batch APIs require unique ids) refuses the file,
  with its line number; results_file is checked before requests_file. Errors never hold content.
- Drop reasons (`REASONS`), checked in this order, the first that applies counts:
  no_request (no request line with the result's custom_id), not_convertible (the request uses
  tools, images or another field the Files API refuses, or the answer is a tool call), errored,
  refused, truncated (unless keep_truncated), empty (the answer is only whitespace),
  invalid_json (require_json and the answer is not a JSON object or array; a bare string or
  number is not what JSON mode means), too_large (the row is over the 1 MiB line limit).
- Earlier assistant turns of a request are context (`"weight": 0`): only the distilled answer
  trains. An Anthropic request ending in an assistant message is a prefill: the answer
  continues it, so the trained turn is prefill + answer.
- The split: a row goes to the validation file when sha256(f"{seed}:{custom_id}")'s first
  8 bytes, big-endian, divided by 2**64 are below eval_fraction. Rows keep the results' order.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple

import orjson

from openft.errors import InvalidRequest
from pipelines._batch_lines import (
    BadLine,
    Prompt,
    Unconvertible,
    parse_request,
    parse_result,
)
from pipelines._rows import MAX_LINE_BYTES

__all__ = [
    "REASONS",
    "Decision",
    "DistillError",
    "DistillOptions",
    "FileCheck",
    "build_row",
    "decide",
    "distill_local",
    "is_eval",
    "iter_lines",
]

REASONS = (
    "no_request",
    "not_convertible",
    "errored",
    "refused",
    "truncated",
    "empty",
    "invalid_json",
    "too_large",
)
RESULTS, REQUESTS = "results_file", "requests_file"


@dataclass(frozen=True)
class DistillOptions:
    require_json: bool = field(default=False, metadata={"help": "Drop answers that are not a JSON object or array."})
    keep_truncated: bool = field(default=False, metadata={"help": "Keep answers cut off by the token limit."})
    eval_fraction: float = field(default=0.1, metadata={"help": "Share of rows held out for validation, in [0, 1)."})
    seed: int = field(default=0, metadata={"help": "Picks which rows are held out; same seed, same split."})

    def __post_init__(self) -> None:
        for name in ("require_json", "keep_truncated"):
            if type(getattr(self, name)) is not bool:
                raise InvalidRequest(f"{name} must be true or false.", code="invalid_value", param=name)
        f = self.eval_fraction
        if type(f) not in (int, float) or not (0 <= f < 1) or math.isnan(f):
            raise InvalidRequest(
                "eval_fraction must be at least 0 and below 1; 0.1 holds out about one row in ten.",
                code="invalid_value",
                param="eval_fraction",
            )
        if type(self.seed) is not int or not (0 <= self.seed < 2**63):
            raise InvalidRequest("seed must be a non-negative integer below 2**63.", code="invalid_value", param="seed")


class DistillError(InvalidRequest):
    """A source file the distillation refuses: a fixed code, the file's parameter, a line number."""

    def __init__(self, code: str, detail: str, param: str, line: int | None = None):
        self.detail = detail
        self.line = line
        super().__init__(f"line {line}: {detail}" if line is not None else detail, code=code, param=param)

    def __reduce__(self):
        return DistillError, (self.code, self.detail, self.param, self.line)


def mixed_formats(param: str, line: int, fmt: str, first: str) -> DistillError:
    return DistillError(
        "mixed_formats",
        f"this is an {_NAMES[fmt]} batch line but the file's first line is an {_NAMES[first]} one; "
        "a file holds one format.",
        param,
        line,
    )


def duplicate_custom_id(param: str, line: int) -> DistillError:
    return DistillError(
        "duplicate_custom_id", "this custom_id is already used by an earlier line; custom_ids must be unique.", param, line
    )


def empty_file(param: str) -> DistillError:
    return DistillError("empty_file", "the file has no lines.", param)


_NAMES = {"openai": "OpenAI", "anthropic": "Anthropic"}


def is_eval(custom_id: str, options: DistillOptions) -> bool:
    digest = hashlib.sha256(f"{options.seed}:{custom_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < options.eval_fraction * 2**64


def build_row(prompt: Prompt, answer: str) -> bytes:
    """The row's JSONL bytes; equal to orjson.dumps({"messages": [...prompt, answer turn]})."""
    if prompt.prefill is not None:
        answer = prompt.prefill + answer
    head = prompt.messages_json[:-1]  # the list without its closing bracket
    turn = b'{"role":"assistant","content":' + orjson.dumps(answer) + b"}]}"
    return b'{"messages":' + head + (b"," if len(head) > 1 else b"") + turn


def _is_json_container(text: str) -> bool:
    try:
        return type(orjson.loads(text)) in (dict, list)
    except orjson.JSONDecodeError:
        return False


class Decision(NamedTuple):
    reason: str  # "" when kept
    row: bytes = b""


def decide(prompt: Prompt | Unconvertible | None, answer: str, reason: str, options: DistillOptions) -> Decision:
    """One result's fate: `answer`/`reason` from parse_result, `prompt` from parse_request (None: no request)."""
    if prompt is None:
        return Decision("no_request")
    if isinstance(prompt, Unconvertible):
        return Decision("not_convertible")
    if reason:
        return Decision(reason)
    if options.require_json and not _is_json_container(prompt.prefill + answer if prompt.prefill else answer):
        return Decision("invalid_json")
    row = build_row(prompt, answer)
    if len(row) > MAX_LINE_BYTES:
        return Decision("too_large")
    return Decision("", row)


class FileCheck:
    """The file-level rules, fed lines in file order: one format, unique custom_ids."""

    def __init__(self, param: str):
        self.param = param
        self.format: str | None = None
        self.seen: set[str] = set()

    def add(self, line_no: int, fmt: str, custom_id: str) -> None:
        if self.format is None:
            self.format = fmt
        elif fmt != self.format:
            raise mixed_formats(self.param, line_no, fmt, self.format)
        if custom_id in self.seen:
            raise duplicate_custom_id(self.param, line_no)
        self.seen.add(custom_id)


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines without their newline, from chunks with any boundaries; a final newline ends the last line."""
    rest = b""
    for chunk in chunks:
        if b"\n" not in chunk:
            rest += chunk
            continue
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def bad_line(err: BadLine, param: str, line_no: int) -> DistillError:
    return DistillError("invalid_file_format", err.detail, param, line_no)


def distill_local(
    results: Iterable[bytes], requests: Iterable[bytes], options: DistillOptions
) -> tuple[bytes, bytes, dict[str, int]]:
    """(train JSONL, eval JSONL, dropped counts) from the two files' bytes, in one process.

    `results` and `requests` are chunks of the files with any boundaries (as `iter_chunks`
    gives them). Raises DistillError at the first refused line, results_file first.
    """
    prompts: dict[str, Prompt | Unconvertible] = {}
    request_error: DistillError | None = None
    check = FileCheck(REQUESTS)
    try:
        for line_no, line in enumerate(iter_lines(requests), 1):
            try:
                custom_id, fmt, prompt = parse_request(line)
            except BadLine as err:
                raise bad_line(err, REQUESTS, line_no) from None
            check.add(line_no, fmt, custom_id)
            prompts[custom_id] = prompt
        if check.format is None:
            raise empty_file(REQUESTS)
    except DistillError as err:
        request_error = err  # raised after the results file, which is checked first

    train: list[bytes] = []
    held_out: list[bytes] = []
    dropped = dict.fromkeys(REASONS, 0)
    check = FileCheck(RESULTS)
    for line_no, line in enumerate(iter_lines(results), 1):
        try:
            custom_id, fmt, answer, reason = parse_result(line, options.keep_truncated)
        except BadLine as err:
            raise bad_line(err, RESULTS, line_no) from None
        check.add(line_no, fmt, custom_id)
        decision = decide(prompts.get(custom_id), answer, reason, options)
        if decision.reason:
            dropped[decision.reason] += 1
        else:
            (held_out if is_eval(custom_id, options) else train).append(decision.row)
    if check.format is None:
        raise empty_file(RESULTS)
    if request_error is not None:
        raise request_error
    return _jsonl(train), _jsonl(held_out), dropped


def _jsonl(rows: list[bytes]) -> bytes:
    return b"".join(r + b"\n" for r in rows)
