"""multi's calculate_output: parsed, never eval'd; precedence, functions, refusals."""

from __future__ import annotations

import math

import pytest

from graders.formula import FormulaError, parse


@pytest.mark.parametrize(("text", "expected"), [
    ("a + b * c", 1 + 2 * 3),
    ("(a + b) * c", (1 + 2) * 3),
    ("a - b - c", 1 - 2 - 3),
    ("c / b / a", 3 / 2 / 1),
    ("2 ^ 3 ^ 2", 2 ** 9),
    ("-b ^ 2", -4),
    ("min(a, b, c) + max(a, b) * abs(-c)", 1 + 2 * 3),
    ("floor(2.7) + ceil(2.1) + sqrt(16) + exp(0) + log(1)", 2 + 3 + 4 + 1 + 0),
    ("0.5 * a + .25 * b + 1e-1 * c", 0.5 + 0.5 + 0.3),
])
def test_evaluates_with_the_usual_precedence(text, expected):
    assert parse(text, {"a", "b", "c"}).evaluate({"a": 1, "b": 2, "c": 3}) == pytest.approx(expected)


@pytest.mark.parametrize("text", [
    "", "a +", "a b", "(a", "a)", "foo(a)", "__import__('os')", "a.b", "a[0]", "min()", "abs(a, b)",
    "lambda: 1", "a ** b", "open('x')", "(" * 100 + "a" + ")" * 100, "zz + a",
])
def test_refuses_what_is_not_a_formula_over_the_names(text):
    with pytest.raises(FormulaError):
        parse(text, {"a", "b"})


def test_domain_errors_raise_at_evaluation_not_parse():
    f = parse("a / b + log(b) + sqrt(b - a)", {"a", "b"})
    with pytest.raises(ZeroDivisionError):
        f.evaluate({"a": 1, "b": 0})
    with pytest.raises(ValueError):
        parse("sqrt(a)", {"a"}).evaluate({"a": -1})
    assert math.isclose(f.evaluate({"a": 1, "b": 1}), 1.0)
