"""The distillation rules, without Ray: conversion, drop reasons, file rules, the split, `distill_local`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from openft.errors import InvalidRequest
from pipelines._batch_lines import Prompt, Unconvertible, parse_request, parse_result
from pipelines.distill import REASONS, DistillError, DistillOptions, build_row, distill_local, is_eval
from pipelines.validate import StreamingValidator, check_line
from tests.factories import (
    anthropic_request_line,
    anthropic_result_line,
    batch_error_line,
    batch_request_line,
    batch_result_line,
    distill_files,
    jsonl,
    message,
)

MARK = "SECRET-CONTENT-7d1f"


def expected_drops(cases: list[str], options: DistillOptions) -> dict[str, int]:
    """What the rules say each generated case becomes, counted independently of the code."""
    drops = dict.fromkeys(REASONS, 0)
    for case in cases:
        if case == "truncated" and options.keep_truncated:
            case = "prose"
        if case == "prose":
            case = "invalid_json" if options.require_json else "ok"
        if case == "too_large" and options.require_json:
            case = "invalid_json"  # its answer is no JSON, and that is checked first
        if case != "ok":
            drops[case] += 1
    return drops


def rows(data: bytes) -> list[dict]:
    return [orjson.loads(line) for line in data.splitlines()]


def one_row(request: dict, result: dict, **options: Any) -> dict:
    train, held_out, dropped = distill_local([jsonl([result])], [jsonl([request])], DistillOptions(eval_fraction=0, **options))
    assert held_out == b"" and sum(dropped.values()) == 0, dropped
    (row,) = rows(train)
    return row


def drop_reason(request: dict | None, result: dict, **options: Any) -> str:
    requests = jsonl([request or batch_request_line("other")])
    train, held_out, dropped = distill_local([jsonl([result])], [requests], DistillOptions(**options))
    assert train == held_out == b""
    (reason,) = [r for r, n in dropped.items() if n]
    return reason


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "options",
    [DistillOptions(), DistillOptions(require_json=True), DistillOptions(keep_truncated=True, eval_fraction=0.25, seed=9)],
    ids=["defaults", "require_json", "keep_truncated"],
)
def test_realistic_files_give_the_expected_counts_and_valid_training_files(fmt: str, options: DistillOptions):
    results, requests, cases = distill_files(fmt, 3000)
    assert set(cases) >= {"errored", "refused", "truncated", "empty", "no_request", "not_convertible", "too_large"}
    train, held_out, dropped = distill_local([results], [requests], options)

    assert dropped == expected_drops(cases, options)
    kept = len(cases) - sum(dropped.values())
    assert train.count(b"\n") + held_out.count(b"\n") == kept
    for data in (train, held_out):
        for i, line in enumerate(data.splitlines(), 1):
            check_line(line, i, "fine-tune")
        validator = StreamingValidator("fine-tune")
        validator.feed(data)
        assert validator.finish().rows == data.count(b"\n")
    # Rows keep the results' order: the answers' custom_ids (carried in "ok" answers) ascend.
    scores = [orjson.loads(r["messages"][-1]["content"])["score"] for r in rows(train) if r["messages"][-1]["content"][0] == "{"]
    assert scores == sorted(scores) and len(scores) > 1000


def test_repeat_runs_are_byte_identical_and_chunking_does_not_matter():
    results, requests, _ = distill_files("anthropic", 2000, seed=3)
    first = distill_local([results], [requests], DistillOptions(seed=5))
    chunked = distill_local(
        [results[i : i + 997] for i in range(0, len(results), 997)],
        [requests[i : i + 1013] for i in range(0, len(requests), 1013)],
        DistillOptions(seed=5),
    )
    assert first == chunked
    assert first == distill_local([results], [requests], DistillOptions(seed=5))


def test_seeds_split_the_same_rows_differently_into_parts_of_about_the_same_size():
    results, requests, _ = distill_files("openai", 3000, seed=1)
    splits = {}
    for seed in (0, 1):
        train, held_out, dropped = distill_local([results], [requests], DistillOptions(seed=seed))
        splits[seed] = (set(train.splitlines()), set(held_out.splitlines()))
    assert splits[0][0] | splits[0][1] == splits[1][0] | splits[1][1]
    total = len(splits[0][0] | splits[0][1])
    # Recorded: 2,112 rows, each held out with probability 0.1 (211 +- 14 expected per seed),
    # the two held-out sets overlapping about as much as independent draws would (21).
    assert total == 2112
    assert [len(splits[s][1]) for s in (0, 1)] == [186, 238]
    assert len(splits[0][1] & splits[1][1]) == 23


def test_the_split_is_a_hash_of_seed_and_custom_id():
    options = DistillOptions(eval_fraction=0.3, seed=42)
    picked = [is_eval(f"id-{i}", options) for i in range(10_000)]
    assert picked == [is_eval(f"id-{i}", DistillOptions(eval_fraction=0.3, seed=42)) for i in range(10_000)]
    assert 2800 < sum(picked) < 3200
    assert not any(is_eval(f"id-{i}", DistillOptions(eval_fraction=0)) for i in range(1000))
    import hashlib

    digest = hashlib.sha256(b"42:id-7").digest()
    assert is_eval("id-7", options) == (int.from_bytes(digest[:8], "big") / 2**64 < 0.3)


def test_openai_row_keeps_system_and_history_as_context_and_trains_the_answer():
    request = batch_request_line(
        "a",
        [
            message("developer", "Be terse."),
            message("user", [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]),
            message("assistant", "Earlier answer.", refusal=None),
            message("user", "Again, über."),
        ],
        temperature=0.2,
        tools=[],
    )
    row = one_row(request, batch_result_line("a", "Final answer.", refusal=None))
    assert row == {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Part one.\n\nPart two."},
            {"role": "assistant", "content": "Earlier answer.", "weight": 0},
            {"role": "user", "content": "Again, über."},
            {"role": "assistant", "content": "Final answer."},
        ]
    }


def test_anthropic_row_joins_system_blocks_and_answer_blocks_and_continues_a_prefill():
    request = anthropic_request_line(
        "a",
        [
            message("user", [{"type": "text", "text": "Doc.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Q?"}]),
            message("assistant", '{"answer": '),
        ],
        system=[{"type": "text", "text": "You classify."}, {"type": "text", "text": "Reply in JSON."}],
        temperature=0,
    )
    answer = [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": '"yes"'},
        {"type": "text", "text": "}"},
    ]
    row = one_row(request, anthropic_result_line("a", answer), require_json=True)
    assert row == {
        "messages": [
            {"role": "system", "content": "You classify.\n\nReply in JSON."},
            {"role": "user", "content": "Doc.\n\nQ?"},
            {"role": "assistant", "content": '{"answer": "yes"}'},
        ]
    }


def test_build_row_equals_orjson_of_the_whole_row():
    messages = [{"role": "user", "content": "Hi “there”\n"}, {"role": "assistant", "content": "x", "weight": 0}]
    for prompt, expected in [
        (Prompt(orjson.dumps(messages)), messages + [{"role": "assistant", "content": "A\\\"b\" 東"}]),
        (Prompt(b"[]", "Pre "), [{"role": "assistant", "content": 'Pre A\\"b" 東'}]),
    ]:
        assert build_row(prompt, 'A\\"b" 東' if prompt.prefill else "A\\\"b\" 東") == orjson.dumps({"messages": expected})


@pytest.mark.parametrize(
    ("request_line", "why"),
    [
        (batch_request_line("a", tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
        (batch_request_line("a", tool_choice="required"), "tool_choice"),
        (batch_request_line("a", functions=[{"name": "f"}]), "functions"),
        (batch_request_line("a", [message("user", [{"type": "image_url", "image_url": {"url": "u"}}])]), "image_url"),
        (batch_request_line("a", [message("user", [{"type": "input_audio", "input_audio": {}}])]), "input_audio"),
        (batch_request_line("a", [message("user", [{"type": MARK, "text": "t"}])]), "a content part outside the format"),
        (batch_request_line("a", [message("user", "hi", name="alice")]), "name"),
        (batch_request_line("a", [message("user", "hi", **{MARK: 1})]), "a field outside the format"),
        (batch_request_line("a", [message("user", "q"), message("assistant", None, tool_calls=[{"id": "c"}])]), "tool_calls"),
        (batch_request_line("a", [message("tool", "42")]), "role tool"),
        (batch_request_line("a", [message("user", "q"), message("system", "late")]), "a system message after the first"),
        (batch_request_line("a", [message("user", "")]), "empty content"),
        (batch_request_line("a", []) | {"body": {"model": "m", "input": "hi"}}, "messages"),
        (batch_request_line("a") | {"url": "/v1/embeddings"}, "url"),
        (batch_request_line("a", [message("user", "q")] * 1024), "more than 1,024 messages"),
        (anthropic_request_line("a", tools=[{"name": "lookup"}]), "tools"),
        (anthropic_request_line("a", mcp_servers=[{"url": "u"}]), "mcp_servers"),
        (anthropic_request_line("a", [message("user", [{"type": "image", "source": {}}])]), "image"),
        (anthropic_request_line("a", [message("user", [{"type": "document", "source": {}}])]), "document"),
        (anthropic_request_line("a", [message("user", "q"), message("assistant", [{"type": "tool_use", "id": "t"}])]), "tool_use"),
        (anthropic_request_line("a", [message("system", "s")]), "role"),
        (anthropic_request_line("a", system=[{"type": "image"}]), "image"),
    ],
)
def test_unconvertible_requests_are_refused_by_name(request_line: dict, why: str):
    custom_id, _, prompt = parse_request(orjson.dumps(request_line))
    assert (custom_id, prompt) == ("a", Unconvertible(why))
    assert drop_reason(request_line, batch_result_line("a")) == "not_convertible"


RESULT_CASES = [
    (batch_result_line("a", status_code=500), {}, "errored"),
    (batch_error_line("a"), {}, "errored"),
    (batch_result_line("a") | {"error": {"code": "x"}}, {}, "errored"),
    (anthropic_result_line("a", result_type="errored"), {}, "errored"),
    (anthropic_result_line("a", result_type="canceled"), {}, "errored"),
    (anthropic_result_line("a", result_type="expired"), {}, "errored"),
    (batch_result_line("a", None, refusal="No."), {}, "refused"),
    (batch_result_line("a", "partial", finish_reason="content_filter"), {}, "refused"),
    (anthropic_result_line("a", "", stop_reason="refusal"), {}, "refused"),
    (batch_result_line("a", "partial", finish_reason="length"), {}, "truncated"),
    (anthropic_result_line("a", "partial", stop_reason="max_tokens"), {}, "truncated"),
    (batch_result_line("a", "", finish_reason="length"), {"keep_truncated": True}, "empty"),
    (batch_result_line("a", " \n\t"), {}, "empty"),
    (batch_result_line("a", None), {}, "empty"),
    (anthropic_result_line("a", [{"type": "thinking", "thinking": "t"}]), {}, "empty"),
    (batch_result_line("a", None, tool_calls=[{"id": "c"}], finish_reason="tool_calls"), {}, "not_convertible"),
    (anthropic_result_line("a", [{"type": "tool_use", "id": "t"}], stop_reason="tool_use"), {}, "not_convertible"),
    (batch_result_line("a", "plain words"), {"require_json": True}, "invalid_json"),
    (batch_result_line("a", "42"), {"require_json": True}, "invalid_json"),
    (batch_result_line("a", '```json\n{"a": 1}\n```'), {"require_json": True}, "invalid_json"),
    (batch_result_line("a", "{} {}"), {"require_json": True}, "invalid_json"),
    (batch_result_line("a", "y" * (1 << 20)), {}, "too_large"),
]


@pytest.mark.parametrize(("result", "options", "reason"), RESULT_CASES)
def test_each_result_is_dropped_for_its_reason(result: dict, options: dict, reason: str):
    request = anthropic_request_line("a") if "result" in result else batch_request_line("a")
    assert drop_reason(request, result, **options) == reason


def test_a_result_without_its_request_is_no_request_before_anything_else():
    assert drop_reason(None, batch_error_line("a")) == "no_request"
    assert drop_reason(batch_request_line("a", tools=[{"name": "f"}]), batch_error_line("a")) == "not_convertible"


@pytest.mark.parametrize(
    ("answer", "kept"),
    [(' {"a": [1, 2]}\n', True), ("[1, 2]", True), ('"text"', False), ("null", False), ("{'a': 1}", False)],
)
def test_require_json_means_a_json_object_or_array(answer: str, kept: bool):
    options = DistillOptions(require_json=True, eval_fraction=0)
    train, _, dropped = distill_local([jsonl([batch_result_line("a", answer)])], [jsonl([batch_request_line("a")])], options)
    assert (train.count(b"\n"), dropped["invalid_json"]) == ((1, 0) if kept else (0, 1))


def test_truncated_answers_are_kept_on_request():
    result = anthropic_result_line("a", "cut sho", stop_reason="max_tokens")
    row = one_row(anthropic_request_line("a"), result, keep_truncated=True)
    assert row["messages"][-1] == {"role": "assistant", "content": "cut sho"}


def refusal(results: list[Any], requests: list[Any]) -> DistillError:
    with pytest.raises(DistillError) as info:
        distill_local([jsonl(results)], [jsonl(requests)], DistillOptions())
    assert MARK not in info.value.message
    return info.value


@pytest.mark.parametrize(
    ("results", "requests", "expected"),
    [
        ([batch_result_line("a"), {"custom_id": "b", "answer": MARK}], [batch_request_line("a")], ("invalid_file_format", "results_file", 2)),
        ([batch_result_line("a"), MARK.encode()], [batch_request_line("a")], ("invalid_file_format", "results_file", 2)),
        ([batch_result_line("a"), b""], [batch_request_line("a")], ("invalid_file_format", "results_file", 2)),
        ([batch_result_line("a"), {"custom_id": 7, "response": None}], [batch_request_line("a")], ("invalid_file_format", "results_file", 2)),
        ([anthropic_result_line("a") | {"result": {"type": MARK}}], [batch_request_line("a")], ("invalid_file_format", "results_file", 1)),
        ([batch_result_line("a"), batch_result_line("b"), anthropic_result_line("c")], [batch_request_line("a")], ("mixed_formats", "results_file", 3)),
        ([batch_result_line("a"), batch_result_line("b"), batch_result_line("a")], [batch_request_line("a")], ("duplicate_custom_id", "results_file", 3)),
        ([batch_result_line("a")], [batch_request_line("a"), anthropic_request_line("b")], ("mixed_formats", "requests_file", 2)),
        ([batch_result_line("a")], [batch_request_line("a"), batch_request_line("a")], ("duplicate_custom_id", "requests_file", 2)),
        ([batch_result_line("a")], [batch_request_line("a"), {"custom_id": "b", "body": MARK}], ("invalid_file_format", "requests_file", 2)),
        ([batch_result_line("a")], [], ("empty_file", "requests_file", None)),
        ([], [batch_request_line("a")], ("empty_file", "results_file", None)),
        # Both files are refused: the results file is named first.
        ([batch_result_line("a"), MARK.encode()], [MARK.encode()], ("invalid_file_format", "results_file", 2)),
    ],
)
def test_refused_files_name_the_file_code_and_line_never_the_content(results, requests, expected):
    err = refusal(results, requests)
    assert (err.code, err.param, err.line) == expected
    assert isinstance(err, InvalidRequest) and err.status == 400
    if err.line:
        assert err.message.startswith(f"line {err.line}: ")


def test_an_invalid_line_wins_over_a_later_mixed_line_and_vice_versa():
    a, b = batch_result_line("a"), anthropic_result_line("b")
    assert refusal([a, b"{", b], [batch_request_line("a")]).code == "invalid_file_format"
    assert refusal([a, b, b"{"], [batch_request_line("a")]).code == "mixed_formats"


def test_a_results_file_of_one_format_may_pair_with_requests_of_the_other():
    row = one_row(anthropic_request_line("a", [message("user", "Q?")]), batch_result_line("a", "A."))
    assert row == {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]}


def test_parse_result_reports_format_answer_and_reason():
    assert parse_result(orjson.dumps(batch_result_line("x", "Hi")), False) == ("x", "openai", "Hi", "")
    assert parse_result(orjson.dumps(anthropic_result_line("y", "Yo", stop_reason="max_tokens")), True) == ("y", "anthropic", "Yo", "")


@pytest.mark.parametrize(
    ("field", "value"),
    [("eval_fraction", 1.0), ("eval_fraction", -0.1), ("eval_fraction", float("nan")), ("seed", -1), ("seed", True), ("require_json", 1)],
)
def test_options_are_checked(field: str, value: Any):
    with pytest.raises(InvalidRequest) as info:
        DistillOptions(**{field: value})
    assert (info.value.code, info.value.param) == ("invalid_value", field)


def test_every_reason_is_counted_even_when_zero():
    _, _, dropped = distill_local([jsonl([batch_result_line("a")])], [jsonl([batch_request_line("a")])], DistillOptions())
    assert dropped == dict.fromkeys(REASONS, 0)
