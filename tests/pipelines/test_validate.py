"""The per-line rules and the streaming validator, without Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from catalog.bases import BASES
from pipelines.validate import FileStats, FileValidationError, LineInfo, StreamingValidator, check_line, merge
from tests.factories import batch_request_line, batch_result_line, chat_row, jsonl, message, preference_row

MARK = "ZQX-secret-7731"  # stands for user data: must never reach an error message
MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    id: str
    bad: Any  # the row on line 3 (dict) or its raw bytes
    code: str
    names: str = ""  # a field name the message must carry
    purpose: str = "fine-tune"
    good: Any = None  # the rows on lines 1, 2 and 4; default a chat row

    def file(self) -> bytes:
        good = self.good or chat_row()
        return jsonl([good, good, self.bad, good])


def _chat(*messages: dict, **fields: Any) -> dict:
    return {"messages": list(messages), **fields}


U, A = message("user", f"question {MARK}"), message("assistant", f"answer {MARK}")
PREF = preference_row(f"prompt {MARK}", f"yes {MARK}", f"no {MARK}")


def _pref(**changes: Any) -> dict:
    return {**PREF, **changes}


CHAT_CASES = [
    Case("not_json", f'{{"messages": [{{"role": "user", "content": "{MARK}"'.encode(), "invalid_json"),
    Case("json_not_object", f'["{MARK}"]'.encode(), "invalid_json"),
    Case("json_string", f'"{MARK}"'.encode(), "invalid_json"),
    Case("empty_line", b"", "invalid_json"),
    Case("empty_line_crlf", b"\r", "invalid_json"),
    Case("whitespace_line", b"   ", "invalid_json"),
    Case("lone_surrogate", f'{{"messages": [{{"role": "user", "content": "\\ud800{MARK}"}}]}}'.encode(), "invalid_json"),
    Case("no_messages", {"prompt": MARK}, "invalid_messages"),
    Case("messages_not_list", {"messages": MARK}, "invalid_messages", "'messages'"),
    Case("messages_empty", {"messages": []}, "invalid_messages", "'messages'"),
    Case("message_not_object", _chat(U, MARK), "invalid_messages", "message 2"),
    Case("role_unknown", _chat(U, message(MARK, MARK), A), "invalid_messages", "message 2"),
    Case("role_missing", _chat(U, {"content": MARK}, A), "invalid_messages", "message 2"),
    Case("role_not_string", _chat(U, message([MARK], MARK), A), "invalid_messages", "message 2"),
    Case("system_not_first", _chat(U, message("system", MARK), A), "invalid_messages", "message 2"),
    Case("second_system", _chat(message("system", MARK), message("system", MARK), U, A), "invalid_messages", "message 2"),
    Case("content_empty", _chat(U, message("assistant", "")), "invalid_messages", "message 2"),
    Case("content_number", _chat(U, message("assistant", 7)), "invalid_messages", "message 2"),
    Case("content_null", _chat(U, message("assistant", None)), "invalid_messages", "message 2"),
    Case("content_missing", _chat(U, {"role": "assistant"}), "invalid_messages", "message 2"),
    # A prompt without an answer is a reinforcement row: in a chat file, a row of another kind.
    Case("no_assistant", _chat(message("system", MARK), U), "invalid_messages", "assistant"),
    Case("no_assistant_ends_system", _chat(message("system", MARK)), "invalid_messages", "assistant"),
    Case("all_weight_zero", _chat(U, message("assistant", MARK, weight=0)), "invalid_messages", "weight"),
    Case("weight_two", _chat(U, message("assistant", MARK, weight=2)), "invalid_messages", "weight"),
    Case("weight_bool", _chat(U, message("assistant", MARK, weight=True)), "invalid_messages", "weight"),
    Case("weight_float", _chat(U, message("assistant", MARK, weight=1.0)), "invalid_messages", "weight"),
    Case("weight_on_user", _chat(message("user", MARK, weight=1), A), "invalid_messages", "weight"),
    Case("row_tools", _chat(U, A, tools=[{"type": "function", "function": {"name": MARK}}]), "unsupported_field", "'tools'"),
    Case("row_functions", _chat(U, A, functions=[{"name": MARK}]), "unsupported_field", "'functions'"),
    Case("row_parallel", _chat(U, A, parallel_tool_calls=False), "unsupported_field", "'parallel_tool_calls'"),
    Case("row_unknown_key", _chat(U, A, **{MARK: 1}), "unsupported_field", "outside the format"),
    Case("row_input_key", _chat(U, A, input={}), "unsupported_field", "'input'"),
    Case("message_name", _chat(message("user", MARK, name=MARK), A), "unsupported_field", "'name'"),
    Case("tool_calls", _chat(U, message("assistant", MARK, tool_calls=[{"id": MARK}])), "unsupported_field", "'tool_calls'"),
    Case("function_call", _chat(U, message("assistant", MARK, function_call={})), "unsupported_field", "'function_call'"),
    Case("tool_call_id", _chat(U, message("user", MARK, tool_call_id=MARK), A), "unsupported_field", "'tool_call_id'"),
    Case("refusal", _chat(U, message("assistant", MARK, refusal=MARK)), "unsupported_field", "'refusal'"),
    Case("message_unknown_key", _chat(U, message("assistant", MARK, **{MARK: 1})), "unsupported_field", "outside"),
    Case("content_parts", _chat(message("user", [{"type": "text", "text": MARK}]), A), "unsupported_field", "content parts"),
    Case("role_tool", _chat(U, A, message("tool", MARK, tool_call_id="c1"), A), "unsupported_field", "'tool'"),
    Case("role_function", _chat(U, A, message("function", MARK), A), "unsupported_field", "'function'"),
    Case("line_too_large", _chat(U, message("assistant", MARK + "x" * MiB)), "line_too_large"),
    Case("too_many_messages", _chat(*[U, A] * 512, U), "too_many_messages"),
    Case("mixed_kinds", PREF, "mixed_row_kinds", "preference"),
]

PREFERENCE_CASES = [
    Case("pref_no_preferred", {k: v for k, v in PREF.items() if k != "preferred_output"}, "invalid_preference_row",
         "'preferred_output'"),
    Case("pref_input_not_object", _pref(input=[U]), "invalid_preference_row", "'input'"),
    Case("pref_input_no_messages", _pref(input={}), "invalid_preference_row", "'input'"),
    Case("pref_input_empty", _pref(input={"messages": []}), "invalid_preference_row", "'input.messages'"),
    Case("pref_input_ends_assistant", _pref(input={"messages": [U, A]}), "invalid_preference_row", "user message"),
    Case("pref_input_bad_role", _pref(input={"messages": [message(MARK, MARK)]}), "invalid_preference_row", "input.messages"),
    Case("pref_input_tools", _pref(input={"messages": [U], "tools": []}), "unsupported_field", "'tools'"),
    Case("pref_input_unknown", _pref(input={"messages": [U], MARK: 1}), "unsupported_field", "outside"),
    Case("pref_input_role_tool", _pref(input={"messages": [message("tool", MARK), U]}), "unsupported_field", "'tool'"),
    Case("pref_output_two", _pref(preferred_output=[A, A]), "invalid_preference_row", "'preferred_output'"),
    Case("pref_output_empty_list", _pref(non_preferred_output=[]), "invalid_preference_row", "'non_preferred_output'"),
    Case("pref_output_user", _pref(preferred_output=[U]), "invalid_preference_row", "'preferred_output'"),
    Case("pref_output_no_content", _pref(preferred_output=[message("assistant", "")]), "invalid_preference_row",
         "'preferred_output'"),
    Case("pref_output_parts", _pref(preferred_output=[message("assistant", [{"text": MARK}])]), "unsupported_field",
         "content parts"),
    Case("pref_output_weight", _pref(preferred_output=[message("assistant", MARK, weight=1)]), "unsupported_field",
         "'weight'"),
    Case("pref_output_tool_calls", _pref(preferred_output=[message("assistant", MARK, tool_calls=[])]),
         "unsupported_field", "'tool_calls'"),
    Case("pref_outputs_equal", _pref(non_preferred_output=PREF["preferred_output"]), "invalid_preference_row", "differ"),
    Case("pref_row_unknown", _pref(**{MARK: 1}), "unsupported_field", "outside"),
    Case("pref_too_many", _pref(input={"messages": [U, A] * 511 + [U]}), "too_many_messages"),
    Case("pref_mixed_kinds", chat_row(MARK, MARK), "mixed_row_kinds", "chat"),
]
PREFERENCE_CASES = [Case(c.id, c.bad, c.code, c.names, good=preference_row()) for c in PREFERENCE_CASES]

BATCH_CASES = [
    Case(f"{purpose}_{name}", bad, code, "", purpose, good)
    for purpose, good in (("batch", batch_request_line("r1")), ("batch_output", batch_result_line("r1")))
    for name, bad, code in (
        ("no_custom_id", {"body": MARK}, "invalid_batch_line"),
        ("custom_id_empty", {"custom_id": ""}, "invalid_batch_line"),
        ("custom_id_number", {"custom_id": 7}, "invalid_batch_line"),
        ("not_json", f"{{{MARK}".encode(), "invalid_json"),
        ("empty_line", b"", "invalid_json"),
        ("line_too_large", batch_request_line("r2", [message("user", MARK * (MiB // 10))]), "line_too_large"),
    )
]

# Reinforcement rows (issue 26): OpenAI's RFT prompts, messages ending with a user turn and the
# grader's fields beside them.
RFT = _chat(message("system", "Classify."), U, label="refund", meta={"n": 1})
REINFORCEMENT_CASES = [
    Case("rft_with_an_answer", _chat(U, A), "mixed_row_kinds", "assistant"),
    Case("rft_answer_and_fields", _chat(U, A, label="x"), "unsupported_field", "outside the format"),
    Case("rft_ends_with_system", _chat(message("system", MARK), label="x"), "invalid_reinforcement_row", "user message"),
    Case("rft_tools", _chat(U, tools=[], label="x"), "unsupported_field", "'tools'"),
    Case("rft_messages_empty", _chat(label="x"), "invalid_messages", "'messages'"),
    Case("rft_message_name", _chat(message("user", MARK, name=MARK), label="x"), "unsupported_field", "'name'"),
    Case("rft_preference", PREF, "mixed_row_kinds", "preference"),
]
REINFORCEMENT_CASES = [Case(c.id, c.bad, c.code, c.names, good=RFT) for c in REINFORCEMENT_CASES]

CASES = CHAT_CASES + PREFERENCE_CASES + REINFORCEMENT_CASES + BATCH_CASES


def test_reinforcement_rows_are_a_third_kind():
    v = StreamingValidator("fine-tune")
    v.feed(jsonl([RFT, _chat(U, answer=[1, 2])]))
    stats = v.finish()
    assert (stats.row_kind, stats.rows, stats.messages) == ("reinforcement", 2, 3)


def stream_error(data: bytes, purpose: str, chunk: int, **kw: Any) -> FileValidationError:
    v = StreamingValidator(purpose, **kw)
    with pytest.raises(FileValidationError) as info:
        for i in range(0, len(data), chunk):
            v.feed(data[i : i + chunk])
        v.finish()
    return info.value


def stream_stats(data: bytes, purpose: str = "fine-tune", chunk: int = MiB, **kw: Any) -> FileStats:
    v = StreamingValidator(purpose, **kw)
    for i in range(0, len(data), chunk):
        v.feed(data[i : i + chunk])
    return v.finish()


def assert_no_content(err: FileValidationError) -> None:
    for text in (err.message, str(err), repr(err), repr(err.body()), err.detail):
        assert MARK not in text
    assert err.__cause__ is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_first_invalid_line_fails_the_file_with_its_code_and_number(case: Case):
    data = case.file()
    err = stream_error(data, case.purpose, chunk=len(data))
    assert (err.code, err.line) == (case.code, 3)
    assert err.message.startswith("line 3: ")
    assert case.names in err.message
    assert err.body()["error"] == {"message": err.message, "type": "invalid_request_error", "param": "file",
                                   "code": case.code}
    assert_no_content(err)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_chunk_boundaries_do_not_change_the_result(case: Case):
    data = case.file()
    whole = stream_error(data, case.purpose, chunk=len(data))
    bytewise = stream_error(data, case.purpose, chunk=1 if len(data) < 100_000 else 4093)
    assert (bytewise.code, bytewise.line, bytewise.message) == (whole.code, whole.line, whole.message)


def test_check_line_is_pure_and_numbers_the_line_it_is_given():
    assert check_line(b'{"messages": [{"role": "user", "content": "h\xc3\xa9"}, {"role": "assistant", "content": "ok"}]}',
                      12, "fine-tune") == LineInfo("chat", 2, 5)
    with pytest.raises(FileValidationError) as info:
        check_line(b'{"messages": []}', 41, "fine-tune")
    assert (info.value.code, info.value.line) == ("invalid_messages", 41)
    assert info.value.message.startswith("line 41: ")
    assert check_line(b'{"custom_id": "a"}', 1, "batch") == LineInfo(None, 0, 0)


def test_the_first_of_several_invalid_lines_is_reported():
    data = jsonl([chat_row(), b"", {"messages": []}, preference_row()])
    assert (stream_error(data, "fine-tune", 1).line, stream_error(data, "fine-tune", 1).code) == (2, "invalid_json")


def test_a_byte_order_mark_is_refused_with_advice():
    err = stream_error(b"\xef\xbb\xbf" + jsonl([chat_row()]), "fine-tune", 64)
    assert (err.code, err.line) == ("invalid_json", 1)
    assert "byte-order mark" in err.message


@pytest.mark.parametrize(
    "data",
    [
        jsonl([chat_row(), chat_row()]),
        jsonl([chat_row(), chat_row()], final_newline=False),
        jsonl([chat_row(), chat_row()], newline=b"\r\n"),
        jsonl([chat_row(), chat_row()], newline=b"\r\n", final_newline=False),
    ],
    ids=["lf", "lf_no_final", "crlf", "crlf_no_final"],
)
def test_line_endings_accepted(data: bytes):
    stats = stream_stats(data, chunk=3)
    assert (stats.rows, stats.messages, stats.bytes) == (2, 6, len(data))


def test_more_than_one_newline_at_the_end_is_an_empty_line():
    err = stream_error(jsonl([chat_row(), chat_row()]) + b"\n", "fine-tune", 5)
    assert (err.code, err.line) == ("invalid_json", 3)


def test_line_size_limit_is_exact():
    def row_of(size: int) -> bytes:
        line = jsonl([chat_row("q", "")], final_newline=False)  # content filled to reach `size` bytes
        return line.replace(b'"content":""', b'"content":"' + b"a" * (size - len(line)) + b'"')

    exact = row_of(MiB)
    assert len(exact) == MiB
    assert stream_stats(exact + b"\r\n" + exact, chunk=65536).rows == 2
    err = stream_error(exact + b"\n" + row_of(MiB + 1) + b"\n", "fine-tune", 65536)
    assert (err.code, err.line) == ("line_too_large", 2)


def test_file_size_limit_is_detected_while_streaming():
    data = jsonl([chat_row()] * 10)
    assert stream_stats(data, max_bytes=len(data)).rows == 10
    v = StreamingValidator("fine-tune", max_bytes=len(data) - 1)
    v.feed(data[:100])
    with pytest.raises(FileValidationError) as info:
        v.feed(data[100:])
    assert (info.value.code, info.value.line) == ("file_too_large", None)
    assert f"{len(data) - 1:,} bytes" in info.value.message
    with pytest.raises(FileValidationError):  # a failed validator stays failed
        v.finish()


def test_an_invalid_line_before_the_size_limit_is_reported_first():
    data = jsonl([chat_row(), {"messages": []}] + [chat_row()] * 10)
    err = stream_error(data, "fine-tune", len(data), max_bytes=len(data) - 1)
    assert (err.code, err.line) == ("invalid_messages", 2)


@pytest.mark.parametrize("purpose", ["fine-tune", "batch", "batch_output"])
def test_empty_file(purpose: str):
    err = stream_error(b"", purpose, 1)
    assert (err.code, err.line) == ("empty_file", None)


def test_stats_of_a_small_chat_file():
    rows = [
        chat_row("héllo", "wörld", system="sys"),  # 3 + 6 + 6 bytes
        {"messages": [message("user", "a"), message("assistant", "bb", weight=0), message("user", "c"),
                      message("assistant", "€")]},  # 1 + 2 + 1 + 3 bytes
    ]
    data = jsonl(rows)
    stats = stream_stats(data)
    assert stats == FileStats(row_kind="chat", rows=2, messages=7, content_bytes=22, bytes=len(data))
    # Largest overheads of any base: 10 tokens a message (Qwen3 forms), 40 a row (gpt-oss).
    assert stats.token_upper_bound() == 22 + 7 * 10 + 2 * 40
    estimates = stats.token_estimates()
    assert set(estimates) == set(BASES)
    assert estimates["qwen2.5-7b-instruct"] == 7 + 7 * 6 + 2 * 24
    assert estimates["mistral-7b-instruct-v0.3"] == 8 + 7 * 5 + 2 * 2
    assert all(e <= stats.token_upper_bound() for e in estimates.values())


def test_stats_of_preference_and_batch_files():
    data = jsonl([preference_row("Capital?", "Paris.", "Lyon.", system="Be brief."), preference_row()])
    assert stream_stats(data) == FileStats("preference", 2, 7, 9 + 8 + 6 + 5 + 18 + 6 + 5, len(data))
    data = jsonl([batch_request_line("a"), batch_request_line("b")])
    assert stream_stats(data, "batch") == FileStats(None, 2, 0, 0, len(data))


def test_merge_adds_consecutive_parts():
    a, b = FileStats("chat", 2, 6, 100, 400), FileStats(None, 0, 0, 0, 0)
    assert merge(a, FileStats("chat", 1, 3, 10, 50)) == FileStats("chat", 3, 9, 110, 450)
    assert merge(b, a) == merge(a, b) == a
    with pytest.raises(ValueError):
        merge(a, FileStats("preference", 1, 3, 10, 50))


def test_lines_past_full_check_bytes_are_only_split_and_sized():
    head = jsonl([chat_row()] * 3)
    tail = jsonl([chat_row(), b"not json", {"messages": []}])
    data = head + tail
    v = StreamingValidator("fine-tune", full_check_bytes=len(head))
    for i in range(0, len(data), 7):
        v.feed(data[i : i + 7])
    stats = v.finish()
    assert (v.checked_offset, v.checked_line, v.complete, v.lines) == (len(head), 4, False, 6)
    assert stats == stream_stats(head)
    # A line starting one byte before the threshold is still checked in full.
    err = stream_error(head + b"{}\n" + tail, "fine-tune", 5, full_check_bytes=len(head) + 1)
    assert (err.code, err.line) == ("invalid_messages", 4)
    err = stream_error(head + tail + b"x" * (MiB + 2), "fine-tune", 65536, full_check_bytes=len(head))
    assert (err.code, err.line) == ("line_too_large", 7)


def test_full_check_bytes_past_the_end_checks_everything():
    data = jsonl([chat_row()] * 3, final_newline=False)
    v = StreamingValidator("fine-tune", full_check_bytes=len(data) + 10)
    v.feed(data)
    assert v.finish() == stream_stats(data)
    assert (v.complete, v.checked_offset, v.checked_line) == (True, len(data), 4)


@pytest.mark.parametrize("chunk", [4093, 65536, 3 * MiB])
def test_line_sizes_past_full_check_bytes_are_exact(chunk: int):
    head = jsonl([chat_row()] * 3)
    exact, over = b"a" * MiB, b"a" * (MiB + 1)
    ok = head + b"[]\n" + exact + b"\r\n" + exact + b"\n" + b"x" * MiB + b"\r"
    v = StreamingValidator("fine-tune", full_check_bytes=len(head))
    for i in range(0, len(ok), chunk):
        v.feed(ok[i : i + chunk])
    assert (v.finish().rows, v.lines) == (3, 7)
    for data, line in (
        (head + b"[]\n" + exact + b"\n" + over + b"\n" + exact + b"\n", 6),
        (head + b"[]\n" * 5 + over + b"\r\n", 9),
        (head + over + b"\n", 4),
        (head + b"[]\n" + over, 5),
    ):
        err = stream_error(data, "fine-tune", chunk, full_check_bytes=len(head))
        assert (err.code, err.line) == ("line_too_large", line)
