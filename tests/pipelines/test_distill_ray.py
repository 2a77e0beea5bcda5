"""The Ray Data distillation job gives, byte for byte, what `distill_local` gives."""

from __future__ import annotations

import pytest

from pipelines.distill import REASONS, DistillError, DistillOptions, distill_local
from pipelines.distill_ray import DistillResult, build_distill
from pipelines.validate import StreamingValidator
from storage.objects import ObjectStore, open_object_store
from tests.factories import (
    anthropic_result_line,
    batch_request_line,
    batch_result_line,
    distill_files,
    jsonl,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")

BLOCK = 256 << 10  # several ranges per file, so lines and custom_ids cross tasks
RESULTS, REQUESTS = "files/acct/file-results", "files/acct/file-requests"


@pytest.fixture
def store(tmp_path) -> ObjectStore:
    return open_object_store(f"file://{tmp_path}/objects")


def run(store: ObjectStore, results: bytes, requests: bytes, options: DistillOptions, **kw) -> DistillResult:
    store.put_bytes(RESULTS, results)
    store.put_bytes(REQUESTS, requests)
    kw.setdefault("block_bytes", BLOCK)
    return build_distill(store.spec(), RESULTS, REQUESTS, "distill/out-1", options, **kw)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("openai", DistillOptions()), ("anthropic", DistillOptions(require_json=True, keep_truncated=True, eval_fraction=0.3, seed=4))],
)
def test_the_pipeline_matches_the_local_rules_byte_for_byte(store: ObjectStore, fmt: str, options: DistillOptions):
    results, requests, _ = distill_files(fmt, 4000, seed=2)
    train, held_out, dropped = distill_local([results], [requests], options)

    out = run(store, results, requests, options)

    assert (store.get_bytes(out.train_key), store.get_bytes(out.eval_key)) == (train, held_out)
    assert out.dropped == dropped and list(out.dropped) == list(REASONS)
    assert (out.train_rows, out.eval_rows) == (train.count(b"\n"), held_out.count(b"\n"))
    assert out.train_rows > 1500 and out.eval_rows > 100
    for key in (out.train_key, out.eval_key):
        validator = StreamingValidator("fine-tune")
        validator.feed(store.get_bytes(key))
        assert validator.finish().rows == store.get_bytes(key).count(b"\n")
    assert list(store.list("distill/")) == ["distill/out-1/eval.jsonl", "distill/out-1/train.jsonl"]


def test_repeat_runs_are_byte_identical_and_seeds_change_only_the_split(store: ObjectStore):
    results, requests, _ = distill_files("openai", 3000, seed=5)
    runs = []
    for seed, cpus, block in ((0, None, BLOCK), (0, 1, 3 * BLOCK), (1, None, BLOCK)):
        out = run(store, results, requests, DistillOptions(seed=seed), max_cpus=cpus, block_bytes=block)
        runs.append((store.get_bytes(out.train_key), store.get_bytes(out.eval_key), out.dropped))
    assert runs[0] == runs[1]
    assert runs[2][2] == runs[0][2] and runs[2][:2] != runs[0][:2]
    assert sorted((runs[0][0] + runs[0][1]).splitlines()) == sorted((runs[2][0] + runs[2][1]).splitlines())


def local_error(results: bytes, requests: bytes) -> DistillError:
    with pytest.raises(DistillError) as info:
        distill_local([results], [requests], DistillOptions())
    return info.value


def test_refusals_name_the_same_line_as_the_local_rules(store: ObjectStore):
    results, requests, _ = distill_files("openai", 1500, seed=6)
    lines = results.splitlines(keepends=True)
    late = len(lines) - 10  # in a later range than the line whose format or id it clashes with
    cases = [
        (b"".join(lines[:late] + [b"{}\n"] + lines[late:]), requests, "invalid_file_format", "results_file"),
        (b"".join(lines[:late] + [jsonl([anthropic_result_line("zz")])] + lines[late:]), requests, "mixed_formats", "results_file"),
        (b"".join(lines[:late] + [lines[3]] + lines[late:]), requests, "duplicate_custom_id", "results_file"),
        (results, requests + jsonl([batch_request_line("req-000004")]), "duplicate_custom_id", "requests_file"),
        (results, requests + b"not json\n", "invalid_file_format", "requests_file"),
    ]
    for bad_results, bad_requests, code, param in cases:
        expected = local_error(bad_results, bad_requests)
        with pytest.raises(DistillError) as info:
            run(store, bad_results, bad_requests, DistillOptions())
        assert (info.value.code, info.value.param, info.value.line) == (code, param, expected.line)
        assert info.value.message == expected.message
        assert list(store.list("distill/")) == []  # no output, no shards left behind


def test_results_without_requests_are_all_no_request(store: ObjectStore):
    results = jsonl([batch_result_line(f"r{i}") for i in range(50)])
    out = run(store, results, jsonl([batch_request_line("other")]), DistillOptions())
    assert (out.train_rows, out.eval_rows, out.dropped["no_request"]) == (0, 0, 50)
    assert store.get_bytes(out.train_key) == store.get_bytes(out.eval_key) == b""
