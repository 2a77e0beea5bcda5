"""Evals through the official SDK (`client.evals.*`): create, retrieve, update, list with
pagination, delete; every refusal with its status, code and param and nothing created; another
account's eval answers 404; the Files API's purpose `evals` with line-numbered codes."""

from __future__ import annotations

import io

import openai
import pytest

from tests.factories import jsonl

SCHEMA = {"type": "object", "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
          "required": ["question", "answer"]}
CONFIG = {"type": "custom", "item_schema": SCHEMA, "include_sample_schema": True}
CRITERIA = [
    {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
     "operation": "eq"},
    {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
     "evaluation_metric": "bleu", "pass_threshold": 0.6},
]


def _create(client, **overrides):
    return client.evals.create(**{"data_source_config": CONFIG, "testing_criteria": CRITERIA, "name": "capitals",
                                  "metadata": {"team": "geo"}, **overrides})


def test_create_retrieve_update_list_delete(account):
    client, _, _ = account
    made = _create(client)
    assert made.id.startswith("eval_") and made.object == "eval" and made.name == "capitals"
    assert made.data_source_config.type == "custom"
    assert made.data_source_config.schema_["properties"]["item"] == SCHEMA
    assert "sample" in made.data_source_config.schema_["properties"]
    assert [c.name for c in made.testing_criteria] == ["exact", "close"]
    assert made.testing_criteria[1].pass_threshold == 0.6
    assert client.evals.retrieve(made.id).model_dump() == made.model_dump()
    updated = client.evals.update(made.id, name="capitals v2", metadata={"team": "maps"})
    assert (updated.name, updated.metadata) == ("capitals v2", {"team": "maps"})
    others = [_create(client, name=f"e{i}").id for i in range(3)]
    first = client.evals.list(limit=2)
    assert [e.id for e in first.data] == [made.id, others[0]] and first.has_more
    assert [e.id for e in client.evals.list(limit=2, after=others[0]).data] == others[1:]
    assert [e.id for e in client.evals.list(order="desc", limit=4)] == [*reversed(others), made.id]
    assert client.evals.list(order_by="updated_at", order="desc", limit=1).data[0].id == others[-1]
    deleted = client.evals.delete(made.id)
    assert (deleted.deleted, deleted.eval_id) == (True, made.id)
    with pytest.raises(openai.NotFoundError):
        client.evals.retrieve(made.id)


def test_another_accounts_eval_answers_404(account, api):
    client, _, _ = account
    made = _create(client)
    other = api.client(api.create_account()[1])
    for call in (lambda: other.evals.retrieve(made.id), lambda: other.evals.update(made.id, name="x"),
                 lambda: other.evals.delete(made.id)):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        assert (info.value.body["code"], info.value.body["param"]) == ("not_found", "eval_id")
    assert other.evals.list().data == []
    assert client.evals.retrieve(made.id).name == "capitals"


@pytest.mark.parametrize(("overrides", "code", "param"), [
    ({"data_source_config": {"type": "logs"}}, "unsupported_value", "data_source_config.type"),
    ({"data_source_config": {"type": "stored_completions", "metadata": {}}}, "unsupported_value",
     "data_source_config.type"),
    ({"data_source_config": {**CONFIG, "item_schema": None}}, "missing_required_parameter",
     "data_source_config.item_schema"),
    ({"data_source_config": {**CONFIG, "extra": True}}, "unknown_parameter", "data_source_config.extra"),
    ({"testing_criteria": []}, "invalid_value", "testing_criteria"),
    ({"testing_criteria": [{**CRITERIA[0], "type": "regex_check"}]}, "invalid_value", "testing_criteria[0].type"),
    ({"testing_criteria": [CRITERIA[0], {**CRITERIA[0], "operation": "glob"}]}, "invalid_value",
     "testing_criteria[1].operation"),
    ({"testing_criteria": [{**CRITERIA[0], "reference": "{{item.capital}}"}]}, "invalid_template",
     "testing_criteria[0].reference"),
    ({"data_source_config": {**CONFIG, "include_sample_schema": False}}, "invalid_template", "testing_criteria[0].input"),
    ({"testing_criteria": [{k: v for k, v in CRITERIA[1].items() if k != "pass_threshold"}]},
     "missing_required_parameter", "testing_criteria[0].pass_threshold"),
    ({"testing_criteria": [{"type": "multi", "name": "m", "calculate_output": "a",
                            "graders": {"a": {"type": "multi", "name": "a", "calculate_output": "b",
                                              "graders": {"b": CRITERIA[0]}}}}]},
     "invalid_value", "testing_criteria[0].graders.a.type"),
    ({"testing_criteria": [{"type": "label_model", "name": "l", "model": "ft:qwen2.5-0.5b-instruct:x:0123456789ab",
                            "labels": ["a"], "passing_labels": ["a"], "input": [{"role": "user", "content": "x"}]}]},
     "model_not_found", "testing_criteria[0].model"),
    ({"testing_criteria": [CRITERIA[0], {**CRITERIA[0]}]}, "invalid_value", "testing_criteria[1].name"),
    ({"metadata": {"k": 1}}, "invalid_value", "metadata"),
])
def test_refusals_create_nothing(account, overrides, code, param):
    client, _, _ = account
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, **overrides)
    assert (info.value.status_code, info.value.body["code"], info.value.body["param"]) == (400, code, param)
    assert client.evals.list().data == []


def test_files_purpose_evals_is_validated_line_by_line(account):
    client, _, _ = account
    good = jsonl([{"item": {"question": "Capital of France?", "answer": "Paris"}},
                  {"item": {"question": "2+2?", "answer": "4"}, "sample": {"output_text": "4"}}])
    made = client.files.create(file=("items.jsonl", io.BytesIO(good)), purpose="evals")
    assert (made.purpose, made.status, made.model_extra["gridline"]["rows"]) == ("evals", "processed", 2)
    for lines, code, line in [([{"item": {"a": 1}}, {"question": "x"}], "unsupported_field", 2),
                              ([{"item": "x"}], "invalid_eval_line", 1),
                              ([{"item": {}}, {"item": {}, "sample": 3}], "invalid_eval_line", 2)]:
        with pytest.raises(openai.BadRequestError) as info:
            client.files.create(file=("bad.jsonl", io.BytesIO(jsonl(lines))), purpose="evals")
        assert (info.value.body["code"], info.value.body["param"]) == (code, "file")
        assert info.value.body["message"].startswith(f"line {line}:")
    assert [f.id for f in client.files.list(purpose="evals")] == [made.id]
