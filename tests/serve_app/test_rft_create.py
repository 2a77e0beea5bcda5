"""Reinforcement fine-tuning jobs at create (issue 26 item 1), through the official SDK on SQLite and
PostgreSQL: OpenAI's RFT rows upload as a third row kind, `method.reinforcement` is taken as the SDK
sends it with every `auto` resolved and a quote that counts generation, and every refusal answers
its code and param and creates nothing."""

from __future__ import annotations

import io

import openai
import orjson
import pytest
from openai.types.fine_tuning import ReinforcementHyperparameters, ReinforcementMethod
from openai.types.graders import StringCheckGrader

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl

BASE = "qwen2.5-0.5b-instruct"
MARKER = "ZQX-SECRET-RFT-ROW"
GRADER = {"type": "string_check", "name": "label", "input": "{{sample.output_text}}", "reference": "{{item.label}}",
          "operation": "eq"}


def rft_row(ticket: str, label: str, **fields) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}], "label": label,
            **fields}


def rft_jsonl(rows) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


TRAIN = rft_jsonl(rft_row(t, l, meta={"source": "demo"}) for t, l in ticket_splits()[0][:24])
VALID = rft_jsonl(rft_row(t, l) for t, l in ticket_splits()[1][:4])
# Line 3 lacks the field the grader reads (and carries text that must never be echoed).
NO_LABEL = rft_jsonl([rft_row("a", "refund"), rft_row("b", "login"),
                      {"messages": [{"role": "user", "content": MARKER}], "labl": MARKER}]
                     + [rft_row(f"t{i}", "billing") for i in range(20)])


def method(grader=None, **hyperparameters) -> dict:
    settings = {"grader": GRADER if grader is None else grader}
    if hyperparameters:
        settings["hyperparameters"] = hyperparameters
    return {"type": "reinforcement", "reinforcement": settings}


@pytest.fixture(scope="module")
def files(api):
    _, key = api.create_account(open_jobs=5)
    client = api.client(key)

    def up(data: bytes) -> str:
        return client.files.create(file=("f.jsonl", io.BytesIO(data)), purpose="fine-tune").id

    return client, {"train": up(TRAIN), "valid": up(VALID), "no_label": up(NO_LABEL),
                    "chat": up(tickets_jsonl(ticket_splits()[0][:24]))}


def _job_ids(client) -> list[str]:
    return [j.id for j in client.fine_tuning.jobs.list(limit=100).data]


def refused(client, **create) -> dict:
    before = _job_ids(client)
    with pytest.raises(openai.APIStatusError) as info:
        client.fine_tuning.jobs.create(model=create.pop("model", BASE), **create)
    assert info.value.status_code == 400
    assert _job_ids(client) == before
    assert MARKER not in info.value.body["message"]
    return info.value.body


def test_rft_rows_upload_as_their_own_kind(files):
    client, ids = files
    facts = client.files.retrieve(ids["train"]).model_extra["gridline"]
    assert (facts["row_kind"], facts["rows"]) == ("reinforcement", 24)


def test_the_sdks_reinforcement_method_is_taken_with_every_auto_resolved(files):
    client, ids = files
    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=ids["train"], validation_file=ids["valid"], seed=7,
        method={"type": "reinforcement", "reinforcement": ReinforcementMethod(
            grader=StringCheckGrader(**GRADER),
            hyperparameters=ReinforcementHyperparameters(batch_size="auto", compute_multiplier="auto",
                                                         eval_interval="auto", eval_samples="auto", n_epochs="auto",
                                                         learning_rate_multiplier="auto", reasoning_effort="default"))})
    try:
        assert job.method.type == "reinforcement"
        assert job.method.reinforcement.grader.model_dump(exclude_none=True) == GRADER
        hp = job.method.reinforcement.hyperparameters
        assert (hp.batch_size, hp.compute_multiplier, hp.eval_interval, hp.eval_samples, hp.n_epochs) == (8, 1.0, 10, 1, 1)
        assert (hp.learning_rate_multiplier, hp.reasoning_effort) == (1.0, "default")
        assert (hp.model_extra["samples_per_prompt"], hp.model_extra["max_completion_tokens"]) == (8, 256)
        quote = job.model_extra["gridline"]["quote"]
        # 8 samples of (prompt + 256 completion tokens) per row: the upper bound counts every one.
        upper_per_epoch = quote["training_tokens_per_epoch_upper_bound"]
        assert quote["training_tokens_upper_bound"] == 8 * (upper_per_epoch + 24 * 256)
        rft = quote["reinforcement"]
        assert rft["samples_per_prompt"] == 8 and rft["grader_tokens"] == 0  # a string check reads no model
        steps = 3  # 24 prompts, 8 per step
        assert rft["evaluations"] == 2 + steps // 10
        assert rft["generated_tokens"] == 24 * 8 * 256 + rft["evaluations"] * 4 * 1 * 256
        assert "sampling and training" in quote["basis"]
        again = client.fine_tuning.jobs.retrieve(job.id)
        assert again.method.reinforcement.hyperparameters.compute_multiplier == 1.0
    finally:
        client.fine_tuning.jobs.cancel(job.id)


def test_compute_multiplier_scales_the_samples(files):
    client, ids = files
    job = client.fine_tuning.jobs.create(model=BASE, training_file=ids["train"],
                                         method=method(compute_multiplier=0.5, max_completion_tokens=8))
    client.fine_tuning.jobs.cancel(job.id)
    hp = job.method.reinforcement.hyperparameters
    assert (hp.compute_multiplier, hp.model_extra["samples_per_prompt"]) == (0.5, 4)


def test_a_file_of_chat_rows_is_refused_for_reinforcement(files):
    client, ids = files
    body = refused(client, training_file=ids["chat"], method=method())
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")
    assert "line 1" in body["message"]
    body = refused(client, training_file=ids["train"], validation_file=ids["chat"], method=method())
    assert (body["code"], body["param"]) == ("invalid_file_format", "validation_file")
    body = refused(client, training_file=ids["train"])  # prompts cannot train a supervised job
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")


def test_a_template_field_missing_in_a_row_is_refused_with_its_line(files):
    client, ids = files
    body = refused(client, training_file=ids["no_label"], method=method())
    assert (body["code"], body["param"]) == ("invalid_template", "training_file")
    assert body["message"].startswith("line 3 ") and "{{item.label}}" in body["message"]
    assert "method.reinforcement.grader.reference" in body["message"]
    nested = {**GRADER, "reference": "{{item.meta.source}}"}  # present in every training row, absent in validation
    body = refused(client, training_file=ids["train"], validation_file=ids["valid"], method=method(nested))
    assert (body["code"], body["param"]) == ("invalid_template", "validation_file")
    assert body["message"].startswith("line 1 ")


@pytest.mark.parametrize("grader, code, param", [
    ({"type": "multi", "name": "m", "calculate_output": "a", "graders": {"a": {
        "type": "multi", "name": "inner", "calculate_output": "b", "graders": {"b": GRADER}}}},
     "invalid_value", "method.reinforcement.grader.graders.a.type"),
    ({"type": "label_model", "name": "l", "model": BASE, "input": [{"role": "user", "content": "{{sample.output_text}}"}],
      "labels": ["a", "b"], "passing_labels": ["a"]}, "unsupported_value", "method.reinforcement.grader.type"),
    ({**GRADER, "operation": "regex"}, "invalid_value", "method.reinforcement.grader.operation"),
    ({**GRADER, "reference": "{{item.label"}, None, None),  # not a template: literal text, taken
    ({"type": "python", "name": "p", "source": "x = 1"}, "invalid_source", "method.reinforcement.grader.source"),
    ({"type": "score_model", "name": "s", "model": "ft:qwen2.5-0.5b-instruct:someone:abc",
      "input": [{"role": "user", "content": "{{sample.output_text}}"}]}, "model_not_found",
     "method.reinforcement.grader.model"),
    ({"type": "text_similarity", "name": "t", "input": "{{sample.output_text}}", "reference": "{{item.label}}",
      "evaluation_metric": "cosine"}, "unsupported_value", "method.reinforcement.grader.evaluation_metric"),
])
def test_grader_refusals(files, grader, code, param):
    client, ids = files
    if code is None:
        client.fine_tuning.jobs.cancel(client.fine_tuning.jobs.create(
            model=BASE, training_file=ids["train"], method=method(grader)).id)
        return
    body = refused(client, training_file=ids["train"], method=method(grader))
    assert (body["code"], body["param"]) == (code, param)


def test_a_label_model_inside_multi_is_taken(files):
    client, ids = files
    label = {"type": "label_model", "name": "l", "model": BASE, "labels": ["yes", "no"], "passing_labels": ["yes"],
             "input": [{"role": "user", "content": "Is {{sample.output_text}} the label {{item.label}}?"}]}
    grader = {"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * judged",
              "graders": {"exact": GRADER, "judged": label}}
    job = client.fine_tuning.jobs.create(model=BASE, training_file=ids["train"], method=method(grader))
    client.fine_tuning.jobs.cancel(job.id)
    assert job.model_extra["gridline"]["quote"]["reinforcement"]["grader_tokens"] > 0


P = "method.reinforcement.hyperparameters"


@pytest.mark.parametrize("hyperparameters, code, param", [
    ({"reasoning_effort": "high"}, "invalid_value", f"{P}.reasoning_effort"),  # no thinking mode on this base
    ({"reasoning_effort": "extreme"}, "invalid_value", f"{P}.reasoning_effort"),
    ({"compute_multiplier": 10}, "invalid_value", f"{P}.compute_multiplier"),
    ({"compute_multiplier": "lots"}, "invalid_value", f"{P}.compute_multiplier"),
    ({"eval_interval": 0}, "invalid_value", f"{P}.eval_interval"),
    ({"eval_samples": 33}, "invalid_value", f"{P}.eval_samples"),
    ({"batch_size": 0}, "invalid_value", f"{P}.batch_size"),
    ({"n_epochs": 11}, "invalid_value", f"{P}.n_epochs"),
    ({"max_completion_tokens": 0}, "invalid_value", f"{P}.max_completion_tokens"),
    ({"beta": -1}, "invalid_value", f"{P}.beta"),
    ({"max_seq_length": 4096}, "invalid_value", f"{P}.max_seq_length"),
    ({"prompt_loss_weight": 1}, "unknown_parameter", f"{P}.prompt_loss_weight"),
])
def test_hyperparameter_refusals(files, hyperparameters, code, param):
    client, ids = files
    body = refused(client, training_file=ids["train"], method=method(**hyperparameters))
    assert (body["code"], body["param"]) == (code, param)


def test_a_missing_grader_is_refused(files):
    client, ids = files
    body = refused(client, training_file=ids["train"], method={"type": "reinforcement", "reinforcement": {}})
    assert (body["code"], body["param"]) == ("missing_required_parameter", "method.reinforcement.grader")
