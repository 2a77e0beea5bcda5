"""Render a training row with its base's chat template and locate every message in the result.

Pure functions, no Ray. Job create runs `check_row_for_base` / `check_preference_row_for_base` over
both files (refusing with `template_token_in_content` or `invalid_file_format` before anything
starts); the tokenizer stage runs `render_row` / `render_preference_row`, which repeat those checks
and then render, failing the job with `template_mismatch` when a row cannot be trained as written.

Locating messages: the row is rendered twice, once as written and once with each content replaced
by a unique probe string. The probe rendering shows exactly where the template puts each message
(and which ones it drops or repeats); substituting the contents back must reproduce the real
rendering character for character, otherwise the template changed a message (trimmed it, split
off reasoning, moved a system message) and the row fails with the first message that differs.

Messages are named by their 0-based position in the JSON arrays, as `messages[2]`,
`input.messages[0]` or `preferred_output[0]`, and never by their content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jinja2 import TemplateError

from catalog.bases import BaseModelSpec
from openft.errors import InvalidRequest

if TYPE_CHECKING:  # the callers load the tokenizer; the API imports this module without transformers
    from transformers import PreTrainedTokenizerBase

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TOOL_KEYS = ("tool_calls", "function_call")


@dataclass(frozen=True)
class MessageSpan:
    index: int  # position of the message in the row's conversation
    role: str
    start: int  # char offsets of the message's content in RenderedRow.text
    end: int
    turn_end: int | None = None  # assistant turns: just after the end-of-turn token that closes them


@dataclass
class RenderedRow:
    text: str
    spans: list[MessageSpan]


def check_row_for_base(messages: list[dict], base: BaseModelSpec, line_no: int, param: str = "training_file") -> None:
    """Refuse a chat row the base's template cannot train as written (job create)."""
    _raise(_row_problem(messages, _labels("messages", messages), base, final_may_think=True), line_no, param)


def check_preference_row_for_base(row: dict, base: BaseModelSpec, line_no: int, param: str = "training_file") -> None:
    """The same checks for a preference row, on the prompt followed by each output."""
    for conversation, labels in _preference_conversations(row):
        # The prompt already ends with the template's empty think block, so outputs carry none.
        _raise(_row_problem(conversation, labels, base, final_may_think=False), line_no, param)


def render_row(
    messages: list[dict], tokenizer: PreTrainedTokenizerBase, base: BaseModelSpec, line_no: int, param: str = "training_file"
) -> RenderedRow:
    labels = _labels("messages", messages)
    _raise(_row_problem(messages, labels, base, final_may_think=True), line_no, param, code="template_mismatch")
    return _render(messages, labels, tokenizer, base, line_no, param, add_generation_prompt=False)


def render_preference_row(
    row: dict, tokenizer: PreTrainedTokenizerBase, base: BaseModelSpec, line_no: int, param: str = "training_file"
) -> tuple[str, str, str]:
    """(prompt_text, chosen_text, rejected_text): the prompt with the generation prompt, and each
    output as the template continues that prompt, up to and including its end-of-turn token."""
    conversations = _preference_conversations(row)
    for conversation, labels in conversations:
        _raise(_row_problem(conversation, labels, base, final_may_think=False), line_no, param, code="template_mismatch")
    prompt, prompt_labels = row["input"]["messages"], conversations[0][1][:-1]
    prompt_text = _render(prompt, prompt_labels, tokenizer, base, line_no, param, add_generation_prompt=True).text
    completions = []
    for conversation, labels in conversations:
        full = _render(conversation, labels, tokenizer, base, line_no, param, add_generation_prompt=False)
        if not full.text.startswith(prompt_text):
            raise InvalidRequest(
                f"line {line_no}, {labels[-1]}: the chat template of {base.id} renders input.messages differently "
                "once this output follows them, so the pair cannot be trained as written.",
                code="template_mismatch",
                param=param,
            )
        completions.append(full.text[len(prompt_text) : full.spans[-1].turn_end])
    return prompt_text, completions[0], completions[1]


def _preference_conversations(row: dict) -> list[tuple[list[dict], list[str]]]:
    prompt = row["input"]["messages"]
    prompt_labels = _labels("input.messages", prompt)
    return [
        (prompt + [row[key][0]], prompt_labels + [f"{key}[0]"]) for key in ("preferred_output", "non_preferred_output")
    ]


def _labels(name: str, messages: list[dict]) -> list[str]:
    return [f"{name}[{i}]" for i in range(len(messages))]


def _row_problem(
    messages: list[dict], labels: list[str], base: BaseModelSpec, *, final_may_think: bool
) -> tuple[str, str] | None:
    """(code, message without the line) for the first thing in the row the template cannot carry."""
    last = len(messages) - 1
    for i, (message, label) in enumerate(zip(messages, labels)):
        if message.get("role") in ("tool", "function") or any(k in message for k in _TOOL_KEYS):
            if not base.tools_supported:
                return "invalid_file_format", f"{label} is a tool message; {base.id} does not support tool rows."
            continue
        content = message.get("content")
        if not isinstance(content, str):
            continue
        for token in base.control_tokens:
            if token in content:
                return "template_token_in_content", _token_message(label, token, base)
        if base.thinking_template and message.get("role") == "assistant":
            allowed = final_may_think and i == last and is_own_think_form(content)
            token = THINK_CLOSE if THINK_CLOSE in content else THINK_OPEN if THINK_OPEN in content else None
            if token and not allowed:
                form = f"{THINK_OPEN}\\n...\\n{THINK_CLOSE}\\n\\n"
                where = (
                    f"Only a row's last message may start with {form}."
                    if final_may_think
                    else "Preference outputs carry no think block."
                )
                return "template_token_in_content", f"{_token_message(label, token, base)} {where}"
    if base.alternation_required:
        roles = [m.get("role") for m in messages]
        start = 1 if roles and roles[0] == "system" else 0
        for i in range(start, len(roles)):
            expected = "user" if (i - start) % 2 == 0 else "assistant"
            if roles[i] != expected:
                return "invalid_file_format", (
                    f"{labels[i]} is a {roles[i]} message where {base.id} needs {expected}: its rows alternate user "
                    "and assistant after an optional first system message. Merge or reorder the messages."
                )
    return None


def is_own_think_form(content: str) -> bool:
    """`<think>\\n{reasoning}\\n</think>\\n\\n{answer}`: what the Qwen3 templates write for the final
    assistant turn, so that rendering leaves the content unchanged."""
    if content.count(THINK_OPEN) != 1 or content.count(THINK_CLOSE) != 1 or not content.startswith(THINK_OPEN):
        return False
    reasoning, answer = _split_think(content)
    return content == f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{answer}"


def _split_think(content: str) -> tuple[str, str]:
    # The templates' own split: reasoning between the tags without surrounding newlines.
    head, _, answer = content.partition(THINK_CLOSE)
    return head.split(THINK_OPEN)[-1].strip("\n"), answer.lstrip("\n")


def _token_message(label: str, token: str, base: BaseModelSpec) -> str:
    return (
        f"{label} holds {token}, a control token of the {base.id} chat template, as text. "
        "Rewrite it (for example as plain words) and upload the file again."
    )


def _raise(problem: tuple[str, str] | None, line_no: int, param: str, code: str | None = None) -> None:
    if problem is not None:
        raise InvalidRequest(f"line {line_no}, {problem[1]}", code=code or problem[0], param=param)


def _render(
    messages: list[dict],
    labels: list[str],
    tokenizer: PreTrainedTokenizerBase,
    base: BaseModelSpec,
    line_no: int,
    param: str,
    *,
    add_generation_prompt: bool,
) -> RenderedRow:
    probes = _probes(messages, base)
    probe_messages = [m if p is None else {**m, "content": p} for m, p in zip(messages, probes)]
    kwargs = {"enable_thinking": False} if base.thinking_template else {}
    try:
        text, probe_text = (
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
            for m in (messages, probe_messages)
        )
    except TemplateError as exc:
        # The template's own message may quote the row, so it stays out of ours.
        raise InvalidRequest(
            f"line {line_no}: the chat template of {base.id} refused to render the row.", code="template_mismatch", param=param
        ) from exc

    def mismatch(i: int, what: str) -> InvalidRequest:
        return InvalidRequest(
            f"line {line_no}, {labels[i]}: the chat template of {base.id} {what}, so it cannot be trained as written.",
            code="template_mismatch",
            param=param,
        )

    placed = []  # (position in probe_text, message index)
    for i, probe in enumerate(probes):
        if probe is not None:
            count = probe_text.count(probe)
            if count != 1:
                raise mismatch(i, "drops this message" if count == 0 else "writes this message more than once")
            placed.append((probe_text.index(probe), i))
    placed.sort()
    spans, cursor, at = {}, 0, 0  # cursor walks probe_text, `at` the same place in text
    for position, i in placed:
        content = messages[i]["content"]
        markup = probe_text[cursor:position]
        if not (text.startswith(markup, at) and text.startswith(content, at + len(markup))):
            raise mismatch(i, "changes this message (for example trims its whitespace or drops part of it)")
        at += len(markup)
        spans[i] = (at, at + len(content))
        at += len(content)
        cursor = position + len(probes[i])
    if text[at:] != probe_text[cursor:]:
        raise mismatch(placed[-1][1] if placed else 0, "changes the text after this message")
    return RenderedRow(text, [_span(i, messages[i], *spans[i], text, base, mismatch) for i in sorted(spans)])


def _probes(messages: list[dict], base: BaseModelSpec) -> list[str | None]:
    """Per message, a probe content unique in the row that every template writes unchanged (None for
    messages without text). The final assistant turn's think block keeps its form in the probe, as
    the Qwen3 templates write that form unchanged and would rewrite a bare probe around it."""
    taken = "".join(m["content"] for m in messages if isinstance(m.get("content"), str))
    mark = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in taken)  # private-use, absent from the row
    probes: list[str | None] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, str):
            probes.append(None)
        elif base.thinking_template and message.get("role") == "assistant" and is_own_think_form(content):
            probes.append(f"{THINK_OPEN}\n{mark}{i}r{mark}\n{THINK_CLOSE}\n\n{mark}{i}a{mark}")
        else:
            probes.append(f"{mark}{i}{mark}")
    return probes


def _span(i: int, message: dict, start: int, end: int, text: str, base: BaseModelSpec, mismatch) -> MessageSpan:
    turn_end = None
    if message.get("role") == "assistant":
        closer = next((t for t in (base.end_of_turn, base.earlier_end_of_turn) if t and text.startswith(t, end)), None)
        if closer is None:
            raise mismatch(i, f"does not close this message with {base.end_of_turn}")
        turn_end = end + len(closer)
    return MessageSpan(i, message["role"], start, end, turn_end)


# -- batches (issue 13): the generation prompt, rendered by the same code the trainer uses --


def render_generation_prompt(
    messages: list[dict], tokenizer: PreTrainedTokenizerBase, base: BaseModelSpec, line_no: int, param: str = "body.messages"
) -> str:
    """The conversation with the template's generation prompt, exactly the text a trained
    assistant turn continues (render_preference_row renders its prompts the same way). Refuses
    with the upload codes (`template_token_in_content`, `invalid_file_format`) or `template_mismatch`."""
    labels = _labels("messages", messages)
    _raise(_row_problem(messages, labels, base, final_may_think=False), line_no, param)
    return _render(messages, labels, tokenizer, base, line_no, param, add_generation_prompt=True).text
