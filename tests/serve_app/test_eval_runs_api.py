"""Eval runs through the official SDK (`client.evals.runs.*`, `.output_items.*`) against the Serve
app: every refusal (status, code, param, nothing created, no item text echoed) on SQLite and
PostgreSQL; then, with the real job controller and the batch engine on the stand-in base, a jsonl
run graded by string_check and text_similarity (the same score `graders.run` gives), a completions
run sampled on the base with an item that cannot run, a model-graded run with a multi grader, two
runs compared, delete, and the webhook event of an end; cancel mid-sampling in make test-heavy."""

from __future__ import annotations

import io
import time

import openai
import orjson
import pytest

from storage.db import Database
from storage.models import EvalRun, WebhookDelivery
from storage.objects import open_object_store
from tests.factories import db_ft_model, jsonl

BASE = "qwen2.5-0.5b-instruct"
MARKER = "ZQX-SECRET-ITEM-TEXT"
SCHEMA = {"type": "object", "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
          "required": ["question", "answer"]}
CONFIG = {"type": "custom", "item_schema": SCHEMA, "include_sample_schema": True}
EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}
CLOSE = {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "evaluation_metric": "fuzzy_match", "pass_threshold": 0.7}
ITEMS = [{"item": {"question": f"{MARKER} capital of France?", "answer": "Paris"}, "sample": {"output_text": "Paris"}},
         {"item": {"question": "capital of Italy?", "answer": "Rome"}, "sample": {"output_text": "Roma"}},
         {"item": {"question": "capital of Norway?", "answer": "Oslo"}, "sample": {"output_text": "Bergen"}}]
TEMPLATE = {"type": "template", "template": [{"role": "system", "content": "Answer with one word."},
                                             {"role": "user", "content": "{{item.question}}"}]}
ENDED = ("completed", "failed", "canceled")


def jsonl_source(items=ITEMS) -> dict:
    return {"type": "jsonl", "source": {"type": "file_content", "content": items}}


def completions_source(items, model=BASE, **params) -> dict:
    return {"type": "completions", "model": model, "input_messages": TEMPLATE,
            "sampling_params": {"max_completion_tokens": 3, "temperature": 0, "seed": 0, **params},
            "source": {"type": "file_content", "content": items}}


def wait_run(client, eval_id: str, run_id: str, timeout: float = 300, statuses=ENDED):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.evals.runs.retrieve(run_id, eval_id=eval_id)
        if run.status in statuses:
            return run
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout} s")


def items_of(client, eval_id: str, run_id: str, **kw) -> list:
    return list(client.evals.runs.output_items.list(run_id, eval_id=eval_id, **kw))


# -- refusals ---------------------------------------------------------------------------------------
def _refused(client, eval_id: str, data_source, status: int, code: str, param: str) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.evals.runs.create(eval_id, data_source=data_source)
    error = info.value.body
    assert (info.value.status_code, error["code"], error["param"]) == (status, code, param), error
    assert MARKER not in str(error)


def test_every_refusal_creates_nothing(account, api):
    client, account_id, _ = account
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT])
    other_id, other_key = api.create_account()
    other = api.client(other_key)
    theirs = other.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT])
    their_file = other.files.create(file=("items.jsonl", io.BytesIO(jsonl(ITEMS))), purpose="evals")
    chat = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}] * 10
    wrong_purpose = client.files.create(file=("t.jsonl", io.BytesIO(jsonl(chat))), purpose="fine-tune")
    settings = api.settings
    store = open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                              s3_region=settings.s3_region)
    db = Database(settings.resolved_database_url())
    try:
        their_model = db_ft_model(db, store, other_id)
    finally:
        db.dispose()
    by_file = lambda file_id: {"type": "jsonl", "source": {"type": "file_id", "id": file_id}}  # noqa: E731
    bad_template = {**TEMPLATE, "template": [{"role": "user", "content": "{{item.capital}}"}]}
    cases = [
        ("eval_" + "0" * 32, jsonl_source(), 404, "not_found", "eval_id"),
        (theirs.id, jsonl_source(), 404, "not_found", "eval_id"),
        (made.id, by_file(their_file.id), 404, "file_not_found", "data_source.source.id"),
        (made.id, by_file("file-" + "0" * 24), 404, "file_not_found", "data_source.source.id"),
        (made.id, by_file(wrong_purpose.id), 400, "invalid_file_purpose", "data_source.source.id"),
        (made.id, {"type": "csv", "source": {}}, 400, "invalid_value", "data_source.type"),
        (made.id, {"type": "responses", "source": {"type": "responses"}}, 400, "unsupported_value", "data_source.type"),
        (made.id, {**completions_source(ITEMS[:1]), "input_messages": bad_template}, 400, "invalid_template",
         "data_source.input_messages.template[0].content"),
        (made.id, completions_source(ITEMS[:1], model="no-such-model"), 404, "model_not_found", "data_source.model"),
        (made.id, completions_source(ITEMS[:1], model=their_model), 404, "model_not_found", "data_source.model"),
        (made.id, jsonl_source([{"item": {"question": MARKER, "answer": "x"}}]), 400, "invalid_value",
         "data_source.source.content[0]"),
        (made.id, {**jsonl_source(), "model": BASE}, 400, "unknown_parameter", "data_source.model"),
    ]
    for eval_id, data_source, status, code, param in cases:
        _refused(client, eval_id, data_source, status, code, param)
    assert client.evals.runs.list(made.id).data == [] and other.evals.runs.list(theirs.id).data == []
    with pytest.raises(openai.NotFoundError):  # another account's eval: its runs are not listed either
        client.evals.runs.list(theirs.id)


# -- runs on the controller ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def driven(training_api, controller):
    _, key = training_api.create_account()
    client = training_api.client(key, timeout=300)
    hook = client.webhooks.create(name="evals", url="http://127.0.0.1:9/hook",
                                  event_types=["eval.run.succeeded", "eval.run.canceled", "eval.run.failed"])
    assert hook.id
    return client, training_api


def _events(api, run_id: str) -> list[str]:
    db = Database(api.settings.resolved_database_url())
    try:
        with db.session() as session:
            rows = session.query(WebhookDelivery).all()
            return [r.event_type for r in rows if orjson.loads(r.payload)["data"]["id"] == run_id]
    finally:
        db.dispose()


def test_a_jsonl_run_grades_its_samples_as_the_grader_endpoint_does(driven):
    client, api = driven
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT, CLOSE], name="capitals")
    upload = client.files.create(file=("items.jsonl", io.BytesIO(jsonl(ITEMS))), purpose="evals")
    created = client.evals.runs.create(made.id, data_source={"type": "jsonl", "source": {"type": "file_id",
                                                                                         "id": upload.id}}, name="given")
    assert (created.object, created.status, created.eval_id) == ("eval.run", "queued", made.id)
    assert created.report_url.endswith(f"/dashboard/#/evals/{made.id}/runs/{created.id}")
    run = wait_run(client, made.id, created.id)
    assert run.status == "completed", run.error
    assert run.result_counts.model_dump() == {"total": 3, "passed": 1, "failed": 2, "errored": 0}
    per = {r.testing_criteria: (r.passed, r.failed) for r in run.per_testing_criteria_results}
    assert per["exact"] == (1, 2)
    items = items_of(client, made.id, run.id)
    assert [i.datasource_item_id for i in items] == [0, 1, 2]
    assert [i.status for i in items] == ["pass", "fail", "fail"]
    assert [i.datasource_item for i in items] == [row["item"] for row in ITEMS]
    graded = {r.name: r for r in items[1].results}
    same = client.fine_tuning.alpha.graders.run(grader=CLOSE, model_sample="Roma", item=ITEMS[1]["item"])
    assert graded["close"].score == same.reward and graded["exact"].score == 0.0
    assert per["close"] == (sum(r.passed for i in items for r in i.results if r.name == "close"),
                            sum(not r.passed for i in items for r in i.results if r.name == "close"))
    first = client.evals.runs.output_items.list(run.id, eval_id=made.id, limit=2)
    assert [i.id for i in first.data] == [i.id for i in items[:2]] and first.has_more
    assert [i.id for i in items_of(client, made.id, run.id, status="pass")] == [items[0].id]
    one = client.evals.runs.output_items.retrieve(items[2].id, eval_id=made.id, run_id=run.id)
    assert one.model_dump() == items[2].model_dump()
    assert [r.id for r in client.evals.runs.list(made.id, status="completed")] == [run.id]
    assert _events(api, run.id) == ["eval.run.succeeded"]
    with pytest.raises(openai.ConflictError):
        client.evals.runs.cancel(run.id, eval_id=made.id)
    assert client.evals.runs.delete(run.id, eval_id=made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.evals.runs.retrieve(run.id, eval_id=made.id)


def test_two_runs_compared_item_by_item_and_another_account_sees_neither(driven):
    client, api = driven
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT, CLOSE])
    better = [{**row, "sample": {"output_text": row["item"]["answer"]}} for row in ITEMS]
    first, second = (wait_run(client, made.id, client.evals.runs.create(made.id, data_source=jsonl_source(items)).id)
                     for items in (ITEMS, better))
    got = client.get(f"/gridline/evals/{made.id}/compare", cast_to=object,
                     options={"params": {"run_id": first.id, "other_run_id": second.id}})
    assert [r["id"] for r in got["runs"]] == [first.id, second.id]
    rates = [{c["name"]: c["pass_rate"] for c in r["criteria"]} for r in got["runs"]]
    assert rates == [{"exact": 1 / 3, "close": rates[0]["close"]}, {"exact": 1.0, "close": 1.0}]
    assert [(c["datasource_item_id"], c["before"], c["after"]) for c in got["changed"]] == [(1, "fail", "pass"),
                                                                                       (2, "fail", "pass")]
    assert got["changed"][1]["criteria"]["exact"] == {"before": {"score": 0.0, "passed": False},
                                                      "after": {"score": 1.0, "passed": True}}
    assert got["changed"][1]["datasource_item"] == ITEMS[2]["item"]
    _, key = api.create_account()
    other = api.client(key)
    for call in (lambda: other.evals.runs.retrieve(first.id, eval_id=made.id),
                 lambda: other.evals.runs.output_items.list(first.id, eval_id=made.id),
                 lambda: other.get(f"/gridline/evals/{made.id}/compare", cast_to=object,
                                   options={"params": {"run_id": first.id, "other_run_id": second.id}})):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert MARKER not in str(info.value.body)


def test_a_completions_run_samples_the_base_on_the_batch_engine(driven):
    client, api = driven
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT])
    items = [{"item": row["item"]} for row in ITEMS[:2]] + [{"item": {"question": "word " * 6000, "answer": "x"}}]
    run = wait_run(client, made.id, client.evals.runs.create(made.id, data_source=completions_source(items)).id)
    assert (run.status, run.model) == ("completed", BASE)
    assert run.result_counts.total == 3 and run.result_counts.errored == 1
    [usage] = run.per_model_usage
    assert (usage.run_model_name, usage.invocation_count) == (BASE, 2) and usage.prompt_tokens > 10
    assert 1 <= usage.completion_tokens <= 2 * 3
    out = items_of(client, made.id, run.id)
    assert [o.status != "error" for o in out] == [True, True, False]
    assert out[2].sample.error.code == "context_length_exceeded" and out[2].results == []
    for o in out[:2]:
        assert o.sample.model == BASE and o.sample.usage.completion_tokens <= 3
        assert o.sample.input[1].content == o.datasource_item["question"]
        expected = float(o.sample.output[0].content == o.datasource_item["answer"])
        assert o.results[0].score == expected


def test_a_model_graded_run_and_a_multi_grader(driven):
    client, _ = driven
    label = {"type": "label_model", "name": "judge", "model": BASE, "labels": ["yes", "no"], "passing_labels": ["yes"],
             "input": [{"role": "user", "content": "Is {{sample.output_text}} the capital? yes or no."}]}
    multi = {"type": "multi", "name": "both", "calculate_output": "0.5 * exact + 0.5 * close",
             "graders": {"exact": EXACT, "close": {**CLOSE, "name": "close"}}}
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[label, multi])
    run = wait_run(client, made.id, client.evals.runs.create(made.id, data_source=jsonl_source(ITEMS[:2])).id)
    assert run.status == "completed", run.error
    [usage] = run.per_model_usage
    assert (usage.run_model_name, usage.invocation_count) == (BASE, 2) and usage.completion_tokens >= 2
    out = items_of(client, made.id, run.id)
    for o in out:
        judge, both = ({r.name: r for r in o.results}[n] for n in ("judge", "both"))
        assert (judge.model_extra.get("label") in ("yes", "no")) or judge.model_extra["reason"]
        subs = both.model_extra["sub_scores"]
        assert both.score == pytest.approx(0.5 * subs["exact"] + 0.5 * subs["close"])
    assert {r.name: r for r in out[0].results}["both"].score == 1.0


@pytest.mark.heavy  # a second engine start (make test-heavy); tests/evals covers a cancel's kept items in make test
def test_cancel_keeps_what_finished_and_delete_needs_an_ended_run(driven):
    client, api = driven
    made = client.evals.create(data_source_config=CONFIG, testing_criteria=[EXACT])
    items = [{"item": {"question": f"capital number {i}?", "answer": "x"}} for i in range(8)]
    created = client.evals.runs.create(made.id, data_source=completions_source(items, max_completion_tokens=64))
    with pytest.raises(openai.ConflictError) as going:
        client.evals.runs.delete(created.id, eval_id=made.id)
    assert (going.value.status_code, going.value.code, going.value.param) == (409, "run_not_ended", "run_id")
    wait_run(client, made.id, created.id, statuses=("in_progress", *ENDED), timeout=60)
    canceled = client.evals.runs.cancel(created.id, eval_id=made.id)
    assert canceled.status == "canceled"
    db = Database(api.settings.resolved_database_url())
    try:  # the driver, if it had begun, records what finished and lets go of the lease
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with db.session() as session:
                if session.get(EvalRun, created.id).lease_owner is None:
                    break
            time.sleep(0.3)
    finally:
        db.dispose()
    run = client.evals.runs.retrieve(created.id, eval_id=made.id)
    kept = items_of(client, made.id, created.id)
    assert run.status == "canceled" and run.result_counts.total == len(kept) < len(items)
    assert all(k.sample.output for k in kept)  # only items that finished are kept (tests/evals: kept after a cancel)
    assert _events(api, created.id) == ["eval.run.canceled"]
    with pytest.raises(openai.ConflictError) as ended:  # an ended run cannot be canceled again, and is left as it is
        client.evals.runs.cancel(created.id, eval_id=made.id)
    assert (ended.value.status_code, ended.value.code, ended.value.param) == (409, "run_not_cancelable", "run_id")
    assert client.evals.runs.retrieve(created.id, eval_id=made.id).status == "canceled"
    assert _events(api, created.id) == ["eval.run.canceled"]
    assert client.evals.runs.delete(created.id, eval_id=made.id).deleted
