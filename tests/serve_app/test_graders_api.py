"""The grader endpoints through the official SDK (`client.fine_tuning.alpha.graders.run/validate`)
against the deployed API: every grader type, the refusals with their paths, a model grader
answered by a stand-in base through the batch engine, and the python sandbox against escapes with
the service working after each."""

from __future__ import annotations

import openai
import pytest

from openft.settings import Settings
from tests.conftest import SANDBOX_TEST_LIMITS

BASE = "qwen2.5-0.5b-instruct"
CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}
SIMILAR = {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}",
           "reference": "{{item.answer}}", "evaluation_metric": "rouge_1"}
PYTHON = {"type": "python", "name": "py", "source": "def grade(sample, item):\n"
          "    return float(item['answer'].lower() in sample['output_text'].lower())\n"}


def _run(client, grader, sample="The capital is Paris", item=None):
    return client.fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item or {"answer": "Paris"})


def test_run_and_validate_each_grader_type(account):
    client, _, _ = account
    assert _run(client, CHECK).reward == 0.0
    assert _run(client, CHECK, sample="Paris").reward == 1.0
    similar = _run(client, SIMILAR)
    assert similar.reward == pytest.approx(2 * (1 / 4) / (1 / 4 + 1))  # rouge-1: P 1/4, R 1
    assert similar.metadata.type == "text_similarity" and similar.metadata.scores == {"close": similar.reward}
    python = _run(client, PYTHON)
    assert python.reward == 1.0 and not python.metadata.errors.python_grader_runtime_error
    multi = _run(client, {"type": "multi", "name": "both", "graders": {"exact": CHECK, "py": PYTHON},
                          "calculate_output": "0.25 * exact + 0.75 * py"})
    assert multi.reward == 0.75 and multi.sub_rewards == {"exact": 0.0, "py": 1.0}
    validated = client.fine_tuning.alpha.graders.validate(grader=SIMILAR)
    assert validated.grader.evaluation_metric == "rouge_1" and validated.grader.name == "close"


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"grader": {**CHECK, "type": "regex"}}, "invalid_value", "grader.type"),
    ({"grader": {**CHECK, "operation": "startswith"}}, "invalid_value", "grader.operation"),
    ({"grader": {**CHECK, "reference": "{{item.missing}}"}}, "invalid_template", "grader.reference"),
    ({"grader": {"type": "multi", "name": "m", "calculate_output": "inner",
                 "graders": {"inner": {"type": "multi", "name": "i", "graders": {"c": CHECK}, "calculate_output": "c"}}}},
     "invalid_value", "grader.graders.inner.type"),
    ({"grader": {**SIMILAR, "evaluation_metric": "cosine"}}, "unsupported_value", "grader.evaluation_metric"),
    ({"grader": {"type": "score_model", "name": "s", "model": "ft:qwen2.5-0.5b-instruct:someone:0123456789ab",
                 "input": [{"role": "user", "content": "x"}]}}, "model_not_found", "grader.model"),
    ({"grader": {"type": "score_model", "name": "s", "model": "gpt-oss-20b", "input": [{"role": "user", "content": "x"}]}},
     "model_not_available", "grader.model"),
    ({"grader": {**PYTHON, "source": PYTHON["source"] + "#" * (300 * 1024)}}, "source_too_large", "grader.source"),
    ({"grader": CHECK, "model_sample": 3}, "invalid_value", "model_sample"),
    ({"grader": CHECK, "model_sample": "x", "extra": 1}, "unknown_parameter", "extra"),
])
def test_refusals_carry_the_graders_path(account, body, code, param):
    client, _, _ = account
    body = {"model_sample": "Paris", "item": {"answer": "Paris"}, **body}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/fine_tuning/alpha/graders/run", body=body, cast_to=object)
    error = info.value.body
    assert (info.value.status_code, error["code"], error["param"]) == (400, code, param)


def test_a_model_grader_is_answered_by_a_base_this_service_runs(apis):
    api = apis("sqlite")
    client = api.client(api.create_account()[1], timeout=300)
    score = {"type": "score_model", "name": "judge", "model": BASE, "range": [0, 1],
             "input": [{"role": "system", "content": "Answer with one number from 0 to 1."},
                       {"role": "user", "content": "Is '{{sample.output_text}}' the answer '{{item.answer}}'?"}],
             "sampling_params": {"max_completions_tokens": 4}}
    result = _run(client, score)
    usage = result.model_grader_token_usage_per_model[BASE]
    assert usage["prompt_tokens"] > 10 and 1 <= usage["completion_tokens"] <= 4 + 1
    assert result.metadata.token_usage == usage["prompt_tokens"] + usage["completion_tokens"]
    # The untrained stand-in answers words when free; held to a number in the range, it grades.
    assert not result.metadata.errors.model_grader_parse_error, result.model_extra["gridline"]
    assert 0.0 <= result.reward <= 1.0
    label = {"type": "label_model", "name": "label", "model": BASE, "labels": ["yes", "no"], "passing_labels": ["yes"],
             "input": [{"role": "user", "content": "yes or no: {{sample.output_text}}"}]}
    combined = _run(client, {"type": "multi", "name": "m", "graders": {"judge": score, "label": label, "exact": CHECK},
                             "calculate_output": "max(judge, label, exact)"}, sample="Paris")
    assert combined.reward == 1.0 and combined.sub_rewards["exact"] == 1.0
    assert not combined.metadata.errors.model_grader_parse_error and combined.sub_rewards["label"] in (0.0, 1.0)
    assert set(combined.model_grader_token_usage_per_model) == {BASE}


ESCAPES = {
    "network": ("import urllib.request\n    urllib.request.urlopen(item['url'], timeout=2)", "URLError"),
    "data dir": ("return len(open(item['db']).read())", "FileNotFoundError"),
    "environment": ("import os\n    return len(os.environ['OPENFT_DATABASE_URL'])", "KeyError"),
    "write outside scratch": ("open(item['data_dir'] + '/planted', 'w').write('x')", "Error"),
    "fork bomb": ("import os\n    while True:\n        os.fork()", "process limit"),
    "memory bomb": ("b = bytearray(16 * 2**30)", "memory limit"),
    "endless loop": ("while True:\n        pass", "CPU-time limit"),
}


def test_python_escapes_are_contained_graded_zero_and_the_service_works_after(apis, monkeypatch):
    api = apis("sqlite")
    client = api.client(api.create_account()[1], timeout=60)
    settings: Settings = api.settings
    monkeypatch.setenv("OPENFT_DATABASE_URL", settings.resolved_database_url())  # in this process: not the sandbox's
    item = {"answer": "Paris", "url": api.base_url + "/models", "db": str(settings.data_dir / "openft.db"),
            "data_dir": str(settings.data_dir)}
    assert SANDBOX_TEST_LIMITS["grader_python_wall_seconds"] == settings.grader_python_wall_seconds
    for name, (body, reason) in ESCAPES.items():
        source = f"def grade(sample, item):\n    {body}\n    return 1.0\n"
        result = _run(client, {"type": "python", "name": "escape", "source": source}, item=item)
        assert result.reward == 0.0, name
        assert result.metadata.errors.python_grader_runtime_error, name
        assert reason in result.metadata.errors.python_grader_runtime_error_details, name
        assert reason in result.model_extra["gridline"]["reason"], name
        assert _run(client, CHECK, sample="Paris").reward == 1.0, f"the service after {name}"
    assert not (settings.data_dir / "planted").exists()
    assert client.models.list().data  # the API and its database still answer


def test_another_accounts_ft_model_is_not_found_for_graders_and_evals(api, account):
    from serve_app.state import AppState
    from tests.factories import db_account, db_ft_model

    client, _, _ = account
    state = AppState.from_settings(api.settings)
    try:
        theirs = db_ft_model(state.db, state.store, db_account(state.db))
    finally:
        state.db.dispose()
    grader = {"type": "label_model", "name": "l", "model": theirs, "labels": ["a"], "passing_labels": ["a"],
              "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.alpha.graders.validate(grader=grader)
    assert (info.value.body["code"], info.value.body["param"]) == ("model_not_found", "grader.model")
    with pytest.raises(openai.BadRequestError) as info:
        client.evals.create(data_source_config={"type": "custom", "item_schema": {"type": "object"},
                                                "include_sample_schema": True}, testing_criteria=[grader])
    assert (info.value.body["code"], info.value.body["param"]) == ("model_not_found", "testing_criteria[0].model")
    assert client.evals.list().data == []
