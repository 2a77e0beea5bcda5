"""The Batch API end to end through the SDK, with the real job controller and engine (issue 13's
"Done when"): two fine-tunes trained on the ticket task, one batch over the base and both,
each fine-tune right on at least 80 % of its held-out rows and the base on almost none, outputs
that parse as ChatCompletion, error lines with their codes, every custom_id once, and a repeat
with temperature 0 giving identical outputs. Then cancel mid-run and expiry mid-run (a deployment
with a short completion window on the same database and store), each keeping what finished.

make test-heavy: it trains two jobs and runs four batches on 2 CPUs.
"""

from __future__ import annotations

import io
import time

import orjson
import pytest
from openai.types.chat import ChatCompletion

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from tests.factories import batch_request_line, jsonl
from tests.serve_app.test_training_api import SFT, wait

pytestmark = pytest.mark.heavy

BASE = "qwen2.5-0.5b-instruct"
BATCH_ENDED = ("completed", "failed", "expired", "cancelled")


ROTATE = {"delivery": "refund", "refund": "login", "login": "billing", "billing": "delivery"}


def rotate(rows):
    """The second fine-tune's task: the same tickets and label words, each ticket's label moved one on,
    so the two fine-tunes answer every held-out row differently (and the base neither way)."""
    return [(ticket, ROTATE[label]) for ticket, label in rows]


def wait_batch(client, batch_id: str, statuses=BATCH_ENDED, timeout: float = 900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout} s")


def file_lines(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines() if line.strip()]


def request(custom_id: str, model: str, ticket: str, **body) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]
    return batch_request_line(custom_id, messages, model=model, temperature=0, max_tokens=5, **body)


@pytest.fixture(scope="module")
def account(training_api, controller):
    _, key = training_api.create_account(open_jobs=3)
    return training_api.client(key)


@pytest.fixture(scope="module")
def fine_tunes(account) -> dict[str, str]:
    """{"plain": ft name, "rotate": ft name}: two jobs on the ticket task, trained one after the other."""
    train, _ = ticket_splits()
    made = {}
    # The rotated labels go against what the words mean: 5 epochs reach about 78 % here, 8 well over 80 %.
    for name, rows, epochs in (("plain", train, 5), ("rotate", rotate(train), 8)):
        upload = account.files.create(file=(f"{name}.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")
        method = {"type": "supervised", "supervised": {**SFT["supervised"], "hyperparameters": {
            **SFT["supervised"]["hyperparameters"], "n_epochs": epochs}}}
        job = wait(account, account.fine_tuning.jobs.create(model=BASE, training_file=upload.id, method=method,
                                                            seed=0).id, timeout=900)
        assert job.status == "succeeded", job.error
        made[name] = job.fine_tuned_model
    return made


def run_batch_file(client, lines: list[dict], **meta):
    upload = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata=meta or None)
    return wait_batch(client, batch.id)


def test_a_batch_over_the_base_and_two_fine_tunes(account, fine_tunes):
    _, held_out = ticket_splits()
    expected = {BASE: held_out, fine_tunes["plain"]: held_out, fine_tunes["rotate"]: rotate(held_out)}
    lines = [request(f"{tag}-{i}", model, ticket)
             for tag, model in (("base", BASE), ("plain", fine_tunes["plain"]), ("rotate", fine_tunes["rotate"]))
             for i, (ticket, _) in enumerate(held_out)]
    lines += [request("unknown", "ft:qwen2.5-0.5b-instruct:nobody:000000000000", held_out[0][0]),
              request("field", BASE, held_out[0][0], logprobs=True),
              request("long", fine_tunes["plain"], "ticket " * 3000)]
    batch = run_batch_file(account, lines)
    assert batch.status == "completed", batch.errors
    assert batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert (batch.request_counts.total, batch.request_counts.failed) == (len(lines), 3)
    assert batch.request_counts.completed == len(lines) - 3
    assert batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0

    out, errors = file_lines(account, batch.output_file_id), file_lines(account, batch.error_file_id)
    ids = [line["custom_id"] for line in out + errors]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)  # every custom_id exactly once
    assert [line["custom_id"] for line in out] == [line["custom_id"] for line in lines
                                                   if line["custom_id"] in {o["custom_id"] for o in out}]
    codes = {line["custom_id"]: line["response"]["body"]["error"]["code"] for line in errors}
    assert codes == {"unknown": "model_not_found", "field": "unsupported_field", "long": "context_length_exceeded"}
    assert all(line["response"]["status_code"] in (400, 404) for line in errors)

    answers: dict[str, str] = {}
    for line in out:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.usage.prompt_tokens > 0
        answers[line["custom_id"]] = (completion.choices[0].message.content or "").strip()
        assert completion.model == next(x["body"]["model"] for x in lines if x["custom_id"] == line["custom_id"])
    right = {tag: sum(answers[f"{tag}-{i}"].split()[:1] == [label] for i, (_, label) in enumerate(rows))
             for tag, rows in (("base", expected[BASE]), ("plain", expected[fine_tunes["plain"]]),
                               ("rotate", expected[fine_tunes["rotate"]]))}
    print(f"held-out rows answered right, of {len(held_out)}: {right}")  # the closing note's figures (-s)
    assert right["plain"] >= 0.8 * len(held_out), right
    assert right["rotate"] >= 0.8 * len(held_out), right
    assert right["base"] <= 0.1 * len(held_out), right

    again = run_batch_file(account, lines)
    repeat = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
              for line in file_lines(account, again.output_file_id)}
    assert repeat == {cid: next(o["response"]["body"]["choices"][0]["message"]["content"] for o in out
                                if o["custom_id"] == cid) for cid in answers}

    # Distill the batch's answers: its own input file is the requests.
    distilled = account.post("/files/distill", body={"results_file": batch.output_file_id}, cast_to=object)
    assert distilled["training_file"]["gridline"]["derived_from"]["requests_file"] == batch.input_file_id


def _long_lines(n: int, model: str) -> list[dict]:
    return [batch_request_line(f"r{i}", [{"role": "user", "content": f"Write a long story about ticket {i}."}],
                               model=model, temperature=0, max_tokens=64) for i in range(n)]


def _kept_what_finished(client, batch, lines, code: str) -> None:
    out, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    assert sorted(x["custom_id"] for x in out + errors) == sorted(x["custom_id"] for x in lines)
    assert {e["error"]["code"] for e in errors if e["response"] is None} == {code}
    assert batch.request_counts.completed == len(out) and batch.request_counts.failed == len(errors)


def test_cancel_mid_run_stops_within_seconds_and_keeps_what_finished(account):
    # Far more than a quiet machine generates before the cancel lands (1,000 lines took about 10 s
    # in CI); the cancel stops it within seconds, so the size costs nothing but the upload.
    lines = _long_lines(4000, BASE)
    upload = account.files.create(file=("long.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = account.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        seen = account.batches.retrieve(batch.id)
        if seen.status == "in_progress" and seen.request_counts.completed > 0:
            break
        time.sleep(0.3)
    asked = time.monotonic()
    assert account.batches.cancel(batch.id).status == "cancelling"
    done = wait_batch(account, batch.id, timeout=120)
    stopped_in = time.monotonic() - asked
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    assert stopped_in < 30, stopped_in
    assert 0 < done.request_counts.completed < len(lines)
    _kept_what_finished(account, done, lines, "batch_cancelled")


def test_expiry_mid_run_keeps_what_finished(account, apis, training_api):
    """A deployment with a 45 s completion window on the training deployment's database and store:
    its batches run on the same controller and expire mid-run."""
    window = 45  # from the batch's creation: its pickup and the engine's start count, which took
    # over 20 s with make test-heavy's two workers keeping the machine busy (0 lines completed)
    short = apis("batches-short-window", batch_completion_window_seconds=window,
                 database_url=training_api.settings.resolved_database_url(),
                 storage_url=training_api.settings.resolved_storage_url())
    _, key = short.create_account()
    client = short.client(key)
    # Far past the window on any machine here: a quiet one generated 1,500 lines in under 20 s (a
    # batch of that size completed in a 20 s window, and the test failed), so 8,000 need over 100 s.
    # Expiry stops it at the window whatever its size.
    lines = _long_lines(8000, BASE)
    upload = client.files.create(file=("long.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.expires_at == batch.created_at + window
    done = wait_batch(client, batch.id, timeout=300)
    assert done.status == "expired" and done.expired_at >= done.expires_at
    assert 0 < done.request_counts.completed < len(lines) and done.in_progress_at < done.expires_at
    _kept_what_finished(client, done, lines, "batch_expired")


def test_an_eval_passes_the_fine_tune_and_not_its_base_item_by_item(account, fine_tunes):
    """Issue 25's "Done when": an eval with a string_check and a text_similarity criterion, run on
    the fine-tune and on its base over the held-out tickets (the fine-tunes trained above)."""
    _, held_out = ticket_splits()
    schema = {"type": "object", "properties": {"ticket": {"type": "string"}, "label": {"type": "string"}},
              "required": ["ticket", "label"]}
    criteria = [{"type": "string_check", "name": "label", "input": "{{sample.output_text}}",
                 "reference": "{{item.label}}", "operation": "ilike"},
                {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
                 "reference": "{{item.label}}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8}]
    made = account.evals.create(data_source_config={"type": "custom", "item_schema": schema, "include_sample_schema": True},
                                testing_criteria=criteria)
    source = {"type": "file_content", "content": [{"item": {"ticket": t, "label": label}} for t, label in held_out]}
    template = {"type": "template", "template": [{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": "{{item.ticket}}"}]}
    ids = [account.evals.runs.create(made.id, data_source={
        "type": "completions", "model": model, "input_messages": template, "source": source,
        "sampling_params": {"max_completion_tokens": 5, "temperature": 0}}).id for model in (fine_tunes["plain"], BASE)]
    runs = []
    for run_id in ids:
        deadline = time.monotonic() + 600
        while (run := account.evals.runs.retrieve(run_id, eval_id=made.id)).status not in ("completed", "failed",
                                                                                            "canceled"):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert run.status == "completed", run.error
        runs.append(run)
    passed = [run.result_counts.passed for run in runs]
    print(f"eval items passed, of {len(held_out)}: fine-tune {passed[0]}, base {passed[1]}")  # the closing note's figures
    assert passed[0] >= 0.8 * len(held_out) and passed[1] <= 0.1 * len(held_out), passed
    got = account.get(f"/gridline/evals/{made.id}/compare", cast_to=object,
                      options={"params": {"run_id": ids[1], "other_run_id": ids[0]}})
    flipped = [c for c in got["changed"] if (c["before"], c["after"]) == ("fail", "pass")]
    assert len(flipped) >= passed[0] - passed[1]
    assert all(c["datasource_item"]["label"] == held_out[c["datasource_item_id"]][1] for c in flipped)
