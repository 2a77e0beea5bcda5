"""grade() and grade_many() over string checks, model graders (their model call is a seam: here a
hand-written answerer; the service's real one is tested in tests/serve_app/test_graders_api.py)
and multi."""

from __future__ import annotations

import pytest

from graders import ModelAnswer, grade, grade_many, sample_namespace, validate
from graders.grade import Runtime


@pytest.mark.parametrize(("op", "text", "reference", "score"), [
    ("eq", "Paris", "Paris", 1), ("eq", "paris", "Paris", 0), ("ne", "Lyon", "Paris", 1), ("ne", "Paris", "Paris", 0),
    ("like", "It is Paris.", "Paris", 1), ("like", "It is paris.", "Paris", 0), ("ilike", "IT IS PARIS", "Paris", 1),
    ("ilike", "Lyon", "Paris", 0),
])
def test_string_check(op, text, reference, score):
    grader = validate({"type": "string_check", "name": "c", "input": "{{sample.output_text}}",
                       "reference": "{{item.ref}}", "operation": op})
    result = grade(grader, sample_namespace(text), {"ref": reference})
    assert (result.score, result.passed) == (score, bool(score))


def _answers(*texts):
    calls = []

    def call(requests):
        calls.append(requests)
        return [ModelAnswer(t, prompt_tokens=10, completion_tokens=2) if t is not None else ModelAnswer(None, error="down")
                for t in texts[: len(requests)]]

    return call, calls


SCORE = {"type": "score_model", "name": "s", "model": "base-x", "range": [0, 10], "pass_threshold": 7,
         "input": [{"role": "developer", "content": "Grade."},
                   {"role": "user", "content": [{"type": "input_text", "text": "A: {{sample.output_text}} R: {{item.r}}"}]}],
         "sampling_params": {"max_completions_tokens": 5, "temperature": 0.5, "seed": 3}}


def test_score_model_renders_the_prompt_and_parses_every_answer_in_one_call():
    call, calls = _answers('{"result": 8}', "3", "ten", "11", None)
    pairs = [(sample_namespace(f"a{i}"), {"r": f"r{i}"}) for i in range(5)]
    grades = grade_many(validate(SCORE), pairs, Runtime(model_call=call))
    assert len(calls) == 1 and len(calls[0]) == 5
    first = calls[0][0]
    assert first.messages == ({"role": "system", "content": "Grade."}, {"role": "user", "content": "A: a0 R: r0"})
    assert (first.max_tokens, first.temperature, first.seed, first.model) == (5, 0.5, 3, "base-x")
    assert [(g.score, g.passed) for g in grades] == [(8, True), (3, False), (0, False), (0, False), (0, False)]
    assert grades[2].details["errors"] == {"model_grader_parse_error": True} and "not a number" in grades[2].reason
    assert "outside the range" in grades[3].reason
    assert grades[4].details["errors"] == {"model_grader_server_error": True}
    assert grades[0].details["usage"] == {"base-x": {"prompt_tokens": 10, "completion_tokens": 2}}


def test_label_model_checks_passing_labels():
    grader = validate({"type": "label_model", "name": "l", "model": "m", "labels": ["good", "bad"],
                       "passing_labels": ["good"], "input": [{"role": "user", "content": "{{sample.output_text}}"}]})
    call, _ = _answers('{"result": "good"}', " Bad.", "meh")
    grades = grade_many(grader, [(sample_namespace("x"), {})] * 3, Runtime(model_call=call))
    assert [(g.score, g.passed, g.details.get("label")) for g in grades] == [(1, True, "good"), (0, False, "bad"),
                                                                              (0, False, None)]


def test_multi_combines_by_formula_and_keeps_sub_scores():
    grader = validate({"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * judge / 10",
                       "graders": {"exact": {"type": "string_check", "name": "e", "input": "{{sample.output_text}}",
                                             "reference": "{{item.r}}", "operation": "eq"}, "judge": SCORE}})
    call, _ = _answers("6")
    result = grade(grader, sample_namespace("yes"), {"r": "yes"}, Runtime(model_call=call))
    assert result.score == pytest.approx(0.8) and result.details["sub_scores"] == {"exact": 1.0, "judge": 6.0}


def test_a_formula_without_a_value_grades_zero_with_a_reason():
    grader = validate({"type": "multi", "name": "m", "calculate_output": "1 / c",
                       "graders": {"c": {"type": "string_check", "name": "c", "input": "a", "reference": "b",
                                         "operation": "eq"}}})
    result = grade(grader, sample_namespace("x"), {})
    assert result.score == 0 and "division by zero" in result.reason
