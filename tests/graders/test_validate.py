"""validate(): every refusal names its path (param) and a fixed code; templates are checked
against what the grader will see."""

from __future__ import annotations

import pytest

from graders import Rules, Scope, validate
from graders.templates import render, sample_namespace
from openft.errors import InvalidRequest

CHECK = {"type": "string_check", "name": "c", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}
SCORE = {"type": "score_model", "name": "s", "model": "qwen2.5-0.5b-instruct",
         "input": [{"role": "user", "content": "Rate {{sample.output_text}} against {{item.answer}}."}]}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"},
                                           "tags": {"type": "array", "items": {"type": "object",
                                                                                  "properties": {"t": {}}}}}}


def _refused(raw, rules=None, param="grader") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(raw, param, rules)
    return info.value


@pytest.mark.parametrize(("raw", "code", "param"), [
    ("nope", "invalid_value", "grader"),
    ({"name": "x"}, "missing_required_parameter", "grader.type"),
    ({"type": "regex_check"}, "invalid_value", "grader.type"),
    ({**CHECK, "operation": "glob"}, "invalid_value", "grader.operation"),
    ({**CHECK, "flavour": 1}, "unknown_parameter", "grader.flavour"),
    ({k: v for k, v in CHECK.items() if k != "reference"}, "missing_required_parameter", "grader.reference"),
    ({**CHECK, "type": "text_similarity", "operation": None}, "unknown_parameter", "grader.operation"),
    ({"type": "text_similarity", "name": "t", "input": "a", "reference": "b", "evaluation_metric": "cosine"},
     "unsupported_value", "grader.evaluation_metric"),
    ({"type": "text_similarity", "name": "t", "input": "a", "reference": "b", "evaluation_metric": "bertscore"},
     "invalid_value", "grader.evaluation_metric"),
    ({**CHECK, "input": "{{item.missing}}"}, "invalid_template", "grader.input"),
    ({**CHECK, "input": "{{sample.output_txt}}"}, "invalid_template", "grader.input"),
    ({**CHECK, "input": "{{ env.HOME }}"}, "invalid_template", "grader.input"),
    ({**CHECK, "reference": "{{item.tags[0].missing}}"}, "invalid_template", "grader.reference"),
    ({"type": "multi", "name": "m", "calculate_output": "x",
      "graders": {"x": {"type": "multi", "name": "x", "graders": {"c": CHECK}, "calculate_output": "c"}}},
     "invalid_value", "grader.graders.x.type"),
    ({"type": "multi", "name": "m", "calculate_output": "c + d", "graders": {"c": CHECK}},
     "invalid_formula", "grader.calculate_output"),
    ({"type": "multi", "name": "m", "calculate_output": "c", "graders": {"c": {**CHECK, "operation": "sw"}}},
     "invalid_value", "grader.graders.c.operation"),
    ({"type": "python", "name": "p", "source": "x = 1\n"}, "invalid_source", "grader.source"),
    ({"type": "python", "name": "p", "source": "def grade(s, i):\n  return (\n"}, "invalid_source", "grader.source"),
    ({"type": "python", "name": "p", "source": "def grade(s, i): return 1\n" + "#" * 300 * 1024},
     "source_too_large", "grader.source"),
    ({**SCORE, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "unsupported_value", "grader.input[0].content[0].type"),
    ({**SCORE, "input": [{"role": "critic", "content": "x"}]}, "invalid_value", "grader.input[0].role"),
    ({**SCORE, "range": [1, 0]}, "invalid_value", "grader.range"),
    ({**SCORE, "sampling_params": {"temperature": 9}}, "invalid_value", "grader.sampling_params.temperature"),
    ({**SCORE, "type": "label_model", "labels": ["a", "b"], "passing_labels": ["c"]}, "invalid_value",
     "grader.passing_labels"),
])
def test_refusals_name_their_path(raw, code, param):
    exc = _refused(raw, Rules(scope=Scope(item_schema=SCHEMA)))
    assert (exc.status, exc.code, exc.param) == (400, code, param)
    assert "http://x" not in exc.message


def test_the_refused_path_starts_where_the_caller_says():
    exc = _refused({**CHECK, "operation": "glob"}, param="testing_criteria[2]")
    assert exc.param == "testing_criteria[2].operation"


def test_an_eval_without_samples_refuses_sample_references():
    exc = _refused(CHECK, Rules(scope=Scope(item_schema=SCHEMA, sample=False)))
    assert (exc.code, exc.param) == ("invalid_template", "grader.input")


def test_a_run_checks_references_against_its_item():
    validate(CHECK, "grader", Rules(scope=Scope(item={"answer": "x"})))
    exc = _refused(CHECK, Rules(scope=Scope(item={"other": "x"})))
    assert (exc.code, exc.param) == ("invalid_template", "grader.reference")
    assert "{{item.answer}}" in exc.message


def test_the_model_check_is_the_callers():
    def refuse(model, param):
        raise InvalidRequest("no such model", code="model_not_found", param=param)

    exc = _refused(SCORE, Rules(check_model=refuse))
    assert (exc.code, exc.param) == ("model_not_found", "grader.model")


def test_the_sdk_single_grader_form_of_multi_is_read_by_name():
    grader = validate({"type": "multi", "name": "m", "graders": CHECK, "calculate_output": "c * 2"})
    assert list(grader.graders) == ["c"]


def test_templates_render_paths_and_json():
    item = {"answer": "Paris", "n": 3, "tags": [{"t": "x"}], "obj": {"k": [1, 2]}}
    sample = sample_namespace('{"city": "Paris"}')
    text = "{{item.answer}}|{{ item.n }}|{{item.tags[0].t}}|{{item.obj}}|{{sample.output_json.city}}|{{item.none}}"
    assert render(text, sample, item) == 'Paris|3|x|{"k":[1,2]}|Paris|'
