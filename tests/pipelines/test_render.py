"""render.py on the stand-in templates: spans point at each message, and each refusal carries its
code, line and message position but never the row's content."""

from __future__ import annotations


import pytest
from transformers import AutoTokenizer

from catalog.bases import BASES, get_base
from catalog.standins import standin_dir
from openft.errors import InvalidRequest
from pipelines.render import (
    check_preference_row_for_base,
    check_row_for_base,
    is_own_think_form,
    render_preference_row,
    render_row,
)
from tests.factories import chat_row, message, preference_row

OWN_THINK = "<think>\nThe parcel is late.\n</think>\n\ndelivery"


@pytest.fixture(scope="session")
def tokenizers(tmp_path_factory) -> dict:
    root = tmp_path_factory.getbasetemp() / "model-cache"  # the cache tests/catalog builds too
    return {base_id: AutoTokenizer.from_pretrained(standin_dir(base, root)) for base_id, base in BASES.items()}


def _render(tokenizers, base_id, messages, line_no=1):
    return render_row(messages, tokenizers[base_id], get_base(base_id), line_no)


def _refusal(call, *args, code: str, line_no: int) -> str:
    with pytest.raises(InvalidRequest) as info:
        call(*args)
    assert (info.value.code, info.value.param) == (code, "training_file")
    assert info.value.message.startswith(f"line {line_no}, ")
    return info.value.message


@pytest.mark.parametrize("base_id", list(BASES))
def test_spans_point_at_every_message_and_turn_end_after_its_closing_token(tokenizers, base_id):
    base = get_base(base_id)
    system = None if base.alternation_required else "Classify the ticket."  # Mistral drops a system message here
    messages = chat_row("The parcel never came.", "delivery", "And the refund?", "billing", system=system)["messages"]
    row = _render(tokenizers, base_id, messages)
    assert [(s.index, s.role) for s in row.spans] == [(i, m["role"]) for i, m in enumerate(messages)]
    starts = [s.start for s in row.spans]
    assert starts == sorted(starts)
    for span, msg in zip(row.spans, messages):
        assert row.text[span.start : span.end] == msg["content"]
    first, last = [s for s in row.spans if s.role == "assistant"]
    assert row.text[last.end : last.turn_end] == base.end_of_turn
    assert row.text[first.end : first.turn_end] == (base.earlier_end_of_turn or base.end_of_turn)
    assert [s.turn_end for s in row.spans if s.role != "assistant"] == [None] * (len(messages) - 2)


def test_qwen25_spans_are_recorded_offsets(tokenizers):
    row = _render(tokenizers, "qwen2.5-0.5b-instruct", chat_row("Hi", "Yo", system=None)["messages"])
    # The default system turn (98 characters), "<|im_start|>user\n" (17), "Hi", "<|im_end|>\n" (11),
    # "<|im_start|>assistant\n" (22), "Yo", "<|im_end|>" (10).
    assert [(s.start, s.end, s.turn_end) for s in row.spans] == [(115, 117, None), (150, 152, 162)]
    assert row.text[150:162] == "Yo<|im_end|>"


@pytest.mark.parametrize("base_id", ["qwen3-8b", "qwen3.5-9b"])
def test_own_think_form_in_the_last_turn_is_located_whole(tokenizers, base_id):
    messages = chat_row("The parcel never came.", OWN_THINK)["messages"]
    check_row_for_base(messages, get_base(base_id), 1)
    row = _render(tokenizers, base_id, messages)
    last = row.spans[-1]
    assert row.text[last.start : last.turn_end] == OWN_THINK + "<|im_end|>"
    assert row.text.count("<think>") == 1


@pytest.mark.parametrize(
    "base_id,token",
    [
        ("qwen2.5-0.5b-instruct", "<|im_end|>"),
        ("qwen2.5-7b-instruct", "<|endoftext|>"),
        ("qwen3-8b", "<|im_start|>"),
        ("qwen3.5-9b", "<|im_end|>"),
        ("mistral-7b-instruct-v0.3", "</s>"),
        ("mistral-7b-instruct-v0.3", "[INST]"),
        ("llama-3.1-8b-instruct", "<|eot_id|>"),
        ("gpt-oss-20b", "<|channel|>"),
    ],
)
def test_control_token_in_content_is_refused_at_create_and_fails_render(tokenizers, base_id, token):
    content = f"See the docs: {token} ends a turn."
    messages = chat_row("Where is it?", content, system=None)["messages"]
    msg = _refusal(check_row_for_base, messages, get_base(base_id), 12, code="template_token_in_content", line_no=12)
    assert f"messages[1] holds {token}" in msg and "See the docs" not in msg
    msg = _refusal(_render, tokenizers, base_id, messages, 12, code="template_mismatch", line_no=12)
    assert f"messages[1] holds {token}" in msg


@pytest.mark.parametrize(
    "turns,position,token",
    [
        (("Hi", OWN_THINK, "More?", "no"), 1, "</think>"),  # own form, but not the last turn
        (("Hi", "<think>plan</think>delivery"), 1, "</think>"),  # last turn, not the template's form
        (("Hi", "<think>\nunfinished"), 1, "<think>"),
        (("Hi", "delivery </think>"), 1, "</think>"),
    ],
)
def test_think_tags_outside_the_templates_own_form_are_refused(turns, position, token):
    messages = chat_row(*turns, system=None)["messages"]
    msg = _refusal(check_row_for_base, messages, get_base("qwen3-8b"), 4, code="template_token_in_content", line_no=4)
    assert f"messages[{position}] holds {token}" in msg


def test_think_tags_are_plain_text_for_users_and_for_non_thinking_bases():
    messages = chat_row("What does </think> do?", "It closes reasoning.", system=None)["messages"]
    check_row_for_base(messages, get_base("qwen3-8b"), 1)
    check_row_for_base(chat_row("Hi", "a <think> b")["messages"], get_base("qwen2.5-0.5b-instruct"), 1)


@pytest.mark.parametrize(
    "roles,position,expected",
    [
        (("user", "user", "assistant"), 1, "assistant"),
        (("system", "assistant", "user"), 1, "user"),
        (("user", "assistant", "system", "user", "assistant"), 2, "user"),
    ],
)
def test_mistral_rows_must_alternate(tokenizers, roles, position, expected):
    messages = [message(r, f"text {i}") for i, r in enumerate(roles)]
    base = get_base("mistral-7b-instruct-v0.3")
    msg = _refusal(check_row_for_base, messages, base, 3, code="invalid_file_format", line_no=3)
    assert f"messages[{position}] is a {roles[position]} message where {base.id} needs {expected}" in msg
    _refusal(_render, tokenizers, base.id, messages, 3, code="template_mismatch", line_no=3)
    check_row_for_base(messages, get_base("qwen2.5-0.5b-instruct"), 3)


def test_tool_rows_are_refused_on_bases_without_tools():
    messages = chat_row("Hi", "Yo", system=None, extra_messages=[message("tool", "42", tool_call_id="call_1")])["messages"]
    msg = _refusal(check_row_for_base, messages, get_base("llama-3.1-8b-instruct"), 5, code="invalid_file_format", line_no=5)
    assert "messages[2] is a tool message" in msg


@pytest.mark.parametrize(
    "base_id,turns,system,position,what",
    [
        ("mistral-7b-instruct-v0.3", ("Hi", "Yo"), "Be terse.", 0, "drops this message"),
        ("llama-3.1-8b-instruct", ("Hi", "delivery\n"), None, 1, "changes this message"),
        ("llama-3.1-8b-instruct", ("Hi", "ok"), "  Be terse.", 0, "changes this message"),
        ("mistral-7b-instruct-v0.3", ("Hi", " delivery"), None, 1, "changes this message"),
        ("qwen3-8b", ("Hi", "\ndelivery"), None, 1, "changes this message"),
    ],
)
def test_content_the_template_drops_or_changes_is_a_template_mismatch(tokenizers, base_id, turns, system, position, what):
    messages = chat_row(*turns, system=system)["messages"]
    check_row_for_base(messages, get_base(base_id), 9)  # nothing create can see
    msg = _refusal(_render, tokenizers, base_id, messages, 9, code="template_mismatch", line_no=9)
    assert msg.startswith(f"line 9, messages[{position}]: the chat template of {base_id} {what}")


def test_preference_row_renders_prompt_and_completions(tokenizers):
    base = get_base("qwen2.5-0.5b-instruct")
    prompt, chosen, rejected = render_preference_row(preference_row(system="Answer briefly."), tokenizers[base.id], base, 1)
    assert prompt == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert (chosen, rejected) == ("Paris.<|im_end|>", "Lyon.<|im_end|>")


@pytest.mark.parametrize(
    "base_id,prompt_end,chosen",
    [
        ("qwen3-8b", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Paris.<|im_end|>"),
        ("llama-3.1-8b-instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n", "Paris.<|eot_id|>"),
        ("mistral-7b-instruct-v0.3", "[INST] Capital of France?[/INST]", " Paris.</s>"),
        ("gpt-oss-20b", "<|start|>assistant", "<|channel|>final<|message|>Paris.<|return|>"),
    ],
)
def test_preference_completions_continue_the_prompt_per_family(tokenizers, base_id, prompt_end, chosen):
    prompt, got_chosen, _ = render_preference_row(preference_row(), tokenizers[base_id], get_base(base_id), 1)
    assert prompt.endswith(prompt_end) and got_chosen == chosen


def test_preference_rows_keep_the_same_checks(tokenizers):
    qwen3 = get_base("qwen3-8b")
    row = preference_row(preferred=OWN_THINK)
    msg = _refusal(check_preference_row_for_base, row, qwen3, 6, code="template_token_in_content", line_no=6)
    assert "preferred_output[0] holds </think>" in msg
    _refusal(render_preference_row, row, tokenizers[qwen3.id], qwen3, 6, code="template_mismatch", line_no=6)
    row = preference_row(non_preferred="Lyon<|eot_id|>")
    msg = _refusal(check_preference_row_for_base, row, get_base("llama-3.1-8b-instruct"), 2,
                   code="template_token_in_content", line_no=2)
    assert "non_preferred_output[0] holds <|eot_id|>" in msg
    # Mistral v0.3 writes the system message into the prompt's last user turn, then drops it once
    # an answer follows: the pair would train on a prompt the model never saw.
    mistral = get_base("mistral-7b-instruct-v0.3")
    msg = _refusal(render_preference_row, preference_row(system="Be terse."), tokenizers[mistral.id], mistral, 8,
                   code="template_mismatch", line_no=8)
    assert "input.messages[0]: the chat template of mistral-7b-instruct-v0.3 drops this message" in msg


@pytest.mark.parametrize(
    "content,own",
    [
        (OWN_THINK, True),
        ("<think>\n\n</think>\n\nok", True),
        ("<think>\nx\n</think>\nok", False),
        ("<think>x</think>\n\nok", False),
        ("ok <think>\nx\n</think>\n\n", False),
        ("<think>\n<think>\n</think>\n\nok", False),
    ],
)
def test_is_own_think_form(content, own):
    assert is_own_think_form(content) is own
