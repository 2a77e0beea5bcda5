"""The Ray Data validation pipeline agrees with the streaming validator, block by block."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.validate import FileStats, FileValidationError, StreamingValidator
from pipelines.validate_ray import MIN_RANGE_BYTES, block_ranges, build_validation, even_range_bytes
from storage.objects import ObjectStore, open_object_store
from tests.factories import batch_result_line, chat_row, jsonl, preference_row
from tests.pipelines.test_validate import MARK, stream_error, stream_stats

BLOCK = 512  # several blocks in a file of a few kilobytes

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def store(tmp_path) -> ObjectStore:
    return open_object_store(f"file://{tmp_path}/objects")


def put(store: ObjectStore, data: bytes) -> str:
    store.put_bytes("files/acct/file-test", data)
    return "files/acct/file-test"


def rows(n: int = 40) -> list[Any]:
    # Varied lengths so that lines straddle block boundaries at different offsets.
    return [chat_row(f"question {i} " + "x" * (i * 7 % 90), f"answer {i}") for i in range(n)]


def ray_error(store: ObjectStore, data: bytes, purpose: str = "fine-tune", **kw: Any) -> FileValidationError:
    key = put(store, data)
    with pytest.raises(FileValidationError) as info:
        build_validation(store.spec(), key, purpose, block_bytes=BLOCK, **kw)
    return info.value


def line_starting_block(data: bytes, block: int) -> int:
    """The number of the line that starts the `block`-th range."""
    ranges = block_ranges(_Bytes(data), "k", 0, len(data), BLOCK)
    return data[: ranges[block][0]].count(b"\n") + 1


class _Bytes:
    """The one store method block_ranges uses, over bytes in memory."""

    def __init__(self, data: bytes):
        self.data = data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        return self.data[start:end]


def with_line(lines: list[Any], line_no: int, row: Any) -> list[Any]:
    lines = list(lines)
    lines[line_no - 1] = row
    return lines


def _placements() -> list[tuple[str, list[Any]]]:
    base = rows()
    data = jsonl(base)
    start_7 = line_starting_block(data, 7)
    bad = {"messages": [{"role": "tool", "content": MARK}]}
    return [
        ("error_line_1", with_line(base, 1, b"{" + MARK.encode())),
        ("error_line_2", with_line(base, 2, bad)),
        ("error_block_start", with_line(base, start_7, bad)),
        ("error_mid_block", with_line(base, start_7 + 1, {"messages": []})),
        ("error_last_line", with_line(base, 40, b"")),
        ("two_errors_first_wins", with_line(with_line(base, 33, bad), 12, {"messages": [MARK]})),
        ("kind_change_block_start", with_line(base, start_7, preference_row(MARK))),
        ("kind_change_mid_block", with_line(base, start_7 + 1, preference_row(MARK))),
        ("kind_change_before_error", with_line(with_line(base, 30, b""), 20, preference_row(MARK))),
        ("error_before_kind_change", with_line(with_line(base, 30, preference_row()), 20, b"")),
    ]


@pytest.mark.parametrize("lines", [p[1] for p in _placements()], ids=[p[0] for p in _placements()])
def test_first_error_and_line_match_the_streaming_validator(store: ObjectStore, lines: list[Any]):
    data = jsonl(lines)
    expected = stream_error(data, "fine-tune", 4096)
    err = ray_error(store, data)
    assert (err.code, err.line, err.message) == (expected.code, expected.line, expected.message)
    assert MARK not in err.message


@pytest.mark.parametrize(
    "data, purpose",
    [
        (jsonl(rows()), "fine-tune"),
        (jsonl(rows(), newline=b"\r\n", final_newline=False), "fine-tune"),
        (jsonl([preference_row(f"p{i} " * (i + 1), "yes", "no") for i in range(30)]), "fine-tune"),
        (jsonl([batch_result_line(f"r{i}", "z" * i) for i in range(60)]), "batch_output"),
    ],
    ids=["chat", "crlf_no_final_newline", "preference", "batch_output"],
)
def test_stats_match_the_streaming_validator(store: ObjectStore, data: bytes, purpose: str):
    key = put(store, data)
    expected = stream_stats(data, purpose)
    assert build_validation(store.spec(), key, purpose, block_bytes=BLOCK) == expected
    assert expected.bytes == len(data) and expected.rows > 10


def test_continues_where_the_upload_stopped_full_checking(store: ObjectStore):
    lines = rows()
    data = jsonl(lines)
    key = put(store, data)
    v = StreamingValidator("fine-tune", full_check_bytes=3000)
    v.feed(data)
    head = v.finish()
    assert not v.complete and 0 < head.rows < 40
    stats = build_validation(
        store.spec(), key, "fine-tune", start_offset=v.checked_offset, start_line=v.checked_line,
        block_bytes=BLOCK, head_stats=head,
    )
    assert stats == stream_stats(data)

    # An error and a change of row kind past the handoff are numbered as in the whole file.
    for bad, code in ((b"[]", "invalid_json"), (preference_row(), "mixed_row_kinds")):
        data = jsonl(with_line(lines, 35, bad))
        key = put(store, data)
        v = StreamingValidator("fine-tune", full_check_bytes=3000)
        v.feed(data)
        head = v.finish()
        with pytest.raises(FileValidationError) as info:
            build_validation(store.spec(), key, "fine-tune", start_offset=v.checked_offset,
                             start_line=v.checked_line, block_bytes=BLOCK, head_stats=head)
        assert (info.value.code, info.value.line) == (code, 35)


def test_block_ranges_start_at_line_starts_and_skip_lines_longer_than_the_window(store: ObjectStore):
    data = jsonl(rows(10) + [chat_row("q" * (100 << 10), "a")] + rows(10))
    key = put(store, data)
    ranges = block_ranges(store, key, 0, len(data), BLOCK)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(data[s - 1 : s] == b"\n" for s, _ in ranges[1:])
    long_line = data.index(b"q" * 100)
    assert any(s < long_line and e > long_line + (100 << 10) for s, e in ranges)
    assert build_validation(store.spec(), key, "fine-tune", block_bytes=BLOCK) == stream_stats(data)


def test_whole_file_rules(store: ObjectStore):
    assert ray_error(store, b"").code == "empty_file"
    data = jsonl(rows(5))
    err = ray_error(store, data, max_bytes=len(data) - 1)
    assert (err.code, err.line) == ("file_too_large", None)
    key = put(store, data)
    assert build_validation(store.spec(), key, "fine-tune", max_bytes=len(data)) == FileStats(
        "chat", 5, 15, sum(len(b"You are terse.") + len(f"question {i} ") + i * 7 % 90 + len(f"answer {i}")
                          for i in range(5)), len(data)
    )


def test_ranges_split_the_tail_evenly_over_the_cluster_cpus(ray_cluster):
    cpus = int(ray_cluster.cluster_resources()["CPU"])
    assert cpus == 2  # the session cluster
    assert even_range_bytes(56 << 20, 64 << 20) == 28 << 20  # one range per CPU
    assert even_range_bytes((56 << 20) + 1, 64 << 20) == (28 << 20) + 1  # rounded up: still two ranges
    assert even_range_bytes(512 << 20, 64 << 20) == 64 << 20  # capped: more ranges than CPUs
    assert even_range_bytes(100 << 10, 64 << 20) == MIN_RANGE_BYTES  # too small to split
    assert even_range_bytes(56 << 20, 4096) == 4096  # a cap below the minimum wins
