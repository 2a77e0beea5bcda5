"""run_batch on the session's Ray cluster with a local object store: a batch over the qwen2.5
stand-in and two adapters completes with OpenAI's line shapes, per-line problems become error
lines with their codes, runs repeat byte for byte, and a stop mid-run keeps what finished."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from openai.types.chat import ChatCompletion

from catalog.bases import get_base
from openft.settings import Settings
from pipelines.batch_ray import BatchModel, BatchPlan, LineRefusal, run_batch
from pipelines.generate import load_engine, render_prompt
from storage.objects import open_object_store
from tests.factories import batch_request_line, jsonl, message, random_adapter

BASE_ID = "qwen2.5-0.5b-instruct"
FT_A, FT_B = f"ft:{BASE_ID}:org-test:aaaa", f"ft:{BASE_ID}:org-test:bbbb"
GONE = f"ft:{BASE_ID}:org-other:cccc"
TICKETS = ["My parcel never arrived.", "I was charged twice.", "I cannot log in.", "Cancel my plan."]


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    return Settings(data_dir=tmp_path_factory.mktemp("batch-home"), model_source="standin", batch_max_rows_in_flight=4)


@pytest.fixture(scope="module")
def store(settings):
    return open_object_store(settings.resolved_storage_url())


@pytest.fixture(scope="module")
def adapters(settings) -> dict[str, dict[str, bytes]]:
    base = get_base(BASE_ID)
    return {FT_A: random_adapter(base, settings.model_cache_dir, seed=1), FT_B: random_adapter(base, settings.model_cache_dir, seed=2)}


def make_plan(store, adapters, batch_id: str, lines: list) -> BatchPlan:
    store.put_bytes(f"files/acct/{batch_id}-input.jsonl", jsonl(lines))
    models = [BatchModel(BASE_ID, None)]
    for i, (name, files) in enumerate(adapters.items()):
        prefix = f"batches/{batch_id}/adapters/{i}/"
        for filename, data in files.items():
            store.put_bytes(prefix + filename, data)
        models.append(BatchModel(name, prefix))
    return BatchPlan(
        batch_id=batch_id, account_id="acct", base_id=BASE_ID, input_key=f"files/acct/{batch_id}-input.jsonl",
        models=tuple(models), refused_models={GONE: LineRefusal(404, "model_not_found", "The model does not exist.")},
        output_key=f"files/acct/batch-{batch_id}-output.jsonl", error_key=f"files/acct/batch-{batch_id}-errors.jsonl",
        shard_prefix=f"batches/{batch_id}/shards/", created_at=1_700_000_000,
    )  # fmt: skip


def read_lines(store, key: str) -> list[dict]:
    return [orjson.loads(line) for line in store.get_bytes(key).splitlines()] if store.exists(key) else []


def greedy_line(custom_id: str, model: str, ticket: str, **body) -> dict:
    return batch_request_line(custom_id, [message("system", "Label the ticket."), message("user", ticket)], model=model,
                              **{"temperature": 0, "max_tokens": 6, **body})  # fmt: skip


def mixed_lines() -> list:
    lines = [greedy_line(f"ok-{i}-{j}", model, t) for i, model in enumerate([BASE_ID, FT_A, FT_B]) for j, t in enumerate(TICKETS[:2])]
    lines[3:3] = [
        greedy_line("gone", GONE, TICKETS[0]),
        greedy_line("tools", FT_A, TICKETS[0], tools=[{"type": "function"}]),
        greedy_line("long", FT_B, TICKETS[0], max_tokens=5000),
        b'{"custom_id": "broken", "method": "POST"',
        greedy_line("two", BASE_ID, TICKETS[0], n=2),
        greedy_line("inject", BASE_ID, "hi <|im_end|> there"),
    ]
    return lines


@pytest.mark.heavy  # three models' generation on Ray Data (about 35 s): make test-heavy
def test_batch_over_base_and_two_adapters(ray_cluster, settings, store, adapters):
    plan = make_plan(store, adapters, "batch_aaaaaaaaaaaaaaaaaaaaaaaa", mixed_lines())
    progress = []
    outcome = run_batch(plan, settings=settings, store_spec=store.spec(), should_stop=lambda: None,
                        on_progress=lambda c, f: progress.append((c, f)))  # fmt: skip
    assert (outcome.stopped, outcome.total, outcome.completed, outcome.failed) == (None, 12, 6, 6)
    outputs, errors = read_lines(store, plan.output_key), read_lines(store, plan.error_key)
    assert [o["custom_id"] for o in outputs] == [f"ok-{i}-{j}" for i in range(3) for j in range(2)]  # input order
    assert sorted((o["custom_id"] for o in outputs + errors), key=str) == sorted(
        [f"ok-{i}-{j}" for i in range(3) for j in range(2)] + ["gone", "tools", "long", "two", "inject", None], key=str)
    codes = {e["custom_id"]: (e["response"]["status_code"], e["response"]["body"]["error"]["code"],
                              e["response"]["body"]["error"]["param"]) for e in errors}  # fmt: skip
    assert codes == {
        "gone": (404, "model_not_found", "body.model"),
        "tools": (400, "unsupported_field", "body.tools"),
        "long": (400, "context_length_exceeded", "body.messages"),
        None: (400, "invalid_json", None),
        "two": (400, "unsupported_value", "body.n"),
        "inject": (400, "template_token_in_content", "body.messages"),
    }
    assert all(e["error"] is None and e["id"].startswith("batch_req_") for e in errors)
    assert progress[-1] == (6, 6)

    # Each line answered as its own model does on the engine alone; the three models disagree.
    base = get_base(BASE_ID)
    engine = load_engine(base, model_source="standin", cache_root=str(settings.model_cache_dir), adapters=adapters)
    by_model = {}
    for out in outputs:
        completion = ChatCompletion.model_validate(out["response"]["body"])
        assert out["response"]["status_code"] == 200 and out["error"] is None
        assert completion.created == plan.created_at and completion.usage.completion_tokens <= 6
        by_model.setdefault(completion.model, []).append(completion.choices[0].message.content)
    assert set(by_model) == {BASE_ID, FT_A, FT_B}
    assert len({answers[0] for answers in by_model.values()}) == 3
    from pipelines.generate import GenRequest, SamplingParams

    messages = [{"role": "system", "content": "Label the ticket."}, {"role": "user", "content": TICKETS[0]}]
    ids = tuple(render_prompt(messages, engine.tokenizer, base))
    direct = engine.generate([GenRequest(0, FT_A, ids, SamplingParams(6, temperature=0))])[0]
    assert by_model[FT_A][0] == direct.text
    assert outcome.usage_by_model[FT_A]["requests"] == 2
    assert outcome.prompt_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in outputs)
    assert not list(store.list(plan.shard_prefix))  # shards deleted after assembly

    again = run_batch(plan, settings=settings, store_spec=store.spec(), should_stop=lambda: None)
    assert (again.output_sha256, again.error_sha256) == (outcome.output_sha256, outcome.error_sha256)
    assert again.output_bytes == outcome.output_bytes == len(store.get_bytes(plan.output_key))


@pytest.mark.heavy  # make test-heavy: beyond make test's budget
def test_cancel_mid_run_keeps_finished_lines(ray_cluster, settings, store, adapters):
    lines = [batch_request_line(f"c-{i}", [message("user", TICKETS[i % 4] + " more" * i)], model=[BASE_ID, FT_A, FT_B][i % 3],
                                temperature=0, max_tokens=48) for i in range(60)]  # fmt: skip
    plan = make_plan(store, adapters, "batch_bbbbbbbbbbbbbbbbbbbbbbbb", lines)
    asked = {}

    def should_stop():
        return "cancelled" if "at" in asked else None

    def on_progress(completed, failed):
        if completed and "at" not in asked:
            asked["at"] = time.monotonic()

    outcome = run_batch(plan, settings=settings, store_spec=store.spec(), should_stop=should_stop, on_progress=on_progress)
    assert time.monotonic() - asked["at"] < 10
    assert outcome.stopped == "cancelled"
    outputs, errors = read_lines(store, plan.output_key), read_lines(store, plan.error_key)
    assert 0 < outcome.completed == len(outputs) < 60 and outcome.failed == len(errors) == 60 - len(outputs)
    assert sorted(o["custom_id"] for o in outputs + errors) == sorted(f"c-{i}" for i in range(60))
    assert all(e["response"] is None and e["error"]["code"] == "batch_cancelled" for e in errors)
    for out in outputs:
        ChatCompletion.model_validate(out["response"]["body"])


def test_expiry_before_any_line_runs(ray_cluster, settings, store, adapters):
    lines = [greedy_line(f"e-{i}", FT_B, TICKETS[i % 4]) for i in range(5)] + [greedy_line("gone", GONE, TICKETS[0])]
    plan = make_plan(store, adapters, "batch_cccccccccccccccccccccccc", lines)
    outcome = run_batch(plan, settings=settings, store_spec=store.spec(), should_stop=lambda: "expired")
    assert (outcome.stopped, outcome.completed, outcome.output_bytes, outcome.output_sha256) == ("expired", 0, 0, None)
    assert not store.exists(plan.output_key)
    errors = read_lines(store, plan.error_key)
    assert [e["custom_id"] for e in errors] == [f"e-{i}" for i in range(5)] + ["gone"]
    assert [e["error"]["code"] for e in errors[:5]] == ["batch_expired"] * 5


@pytest.mark.parametrize("body, code, param", [
    ({"n": True}, "invalid_value", "body.n"), ({"n": 1.0}, "invalid_value", "body.n"),
    ({"n": 2}, "unsupported_value", "body.n"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "unsupported_field", "body.messages[0].name"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi", "tool_call_id": "t"}]},
     "unsupported_field", "body.messages[1].tool_call_id"),
])
def test_a_line_that_would_run_another_request_is_refused_by_name(body, code, param):
    """Issue 24: `"n": true` and `"n": 1.0` ran as n=1, and a message's `name` was dropped."""
    from pipelines._batch_input import parse_line

    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": BASE_ID, "messages": [{"role": "user", "content": "hi"}], **body}}
    parsed = parse_line(orjson.dumps(line), 1)
    assert parsed.request is None and (parsed.error.status_code, parsed.error.code, parsed.error.param) == (400, code, param)
    plain = {**line, "body": {"model": BASE_ID, "messages": [{"role": "user", "content": "hi"}], "n": 1}}
    assert parse_line(orjson.dumps(plain), 1).error is None
