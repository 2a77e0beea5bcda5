"""Constrained answers (pipelines/answer_format.py): the prefix rules, and the transformers engine on
the untrained stand-in, which answers words unconstrained and a number or a label constrained."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from catalog.bases import get_base
from graders.model_graders import ChoiceAnswer, NumberAnswer, parse_label, parse_score
from pipelines.answer_format import is_number, reachable
from pipelines.engine import GenRequest, SamplingParams
from pipelines.generate import load_engine, render_prompt
from tests.factories import random_adapter

BASE_ID = "qwen2.5-0.5b-instruct"


@pytest.mark.parametrize("text,low,high,ok", [
    ("", 0, 1, True), ("0", 0, 1, True), ("0.", 0, 1, True), ("0.75", 0, 1, True), ("1", 0, 1, True),
    ("1.", 0, 1, True), ("1.0", 0, 1, True), ("1.5", 0, 1, False), ("2", 0, 1, False), ("10", 0, 1, False),
    ("-", 0, 1, True), ("-0", 0, 1, True), ("-1", 0, 1, False), ("00", 0, 1, False), (".5", 0, 1, False),
    ("7", 1, 100, True), ("70", 1, 100, True), ("700", 1, 100, False), ("1", 10, 20, True), ("2", 10, 20, True),
    ("3", 10, 20, False), ("-", -5, 5, True), ("-5", -5, 5, True), ("-5.1", -5, 5, False), ("-6", -5, 5, False),
    ("4.99", 5, 6, False), ("5.", 5, 6, True), ("1-", 0, 9, False), ("1..", 0, 9, False), ("x", 0, 9, False),
])  # fmt: skip
def test_a_prefix_is_reachable_when_a_number_in_the_range_begins_with_it(text, low, high, ok):
    assert reachable(text, low, high) is ok


@pytest.mark.parametrize("text,low,high,ok", [
    ("0", 0, 1, True), ("0.5", 0, 1, True), ("1", 0, 1, True), ("1.01", 0, 1, False), ("0.", 0, 1, False),
    ("-0", 0, 1, True), ("", 0, 1, False), ("-", -1, 1, False), ("01", 0, 9, False), ("15", 10, 20, True),
])  # fmt: skip
def test_a_whole_answer_is_one_number_in_the_range(text, low, high, ok):
    assert is_number(text, low, high) is ok


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    cache_root = tmp_path_factory.getbasetemp() / "model-cache"
    base = get_base(BASE_ID)
    adapters = {"ft-a": random_adapter(base, Path(cache_root), seed=3)}
    yield load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters, max_batch_rows=4)
    torch.set_num_threads(previous)


def _requests(engine, answer, *, temperature: float = 0.0) -> list[GenRequest]:
    prompts = ["Score this answer from 0 to 1: Paris.", "How good is 'Lyon' for the capital of France?",
               "Rate: the sky is green.", "Grade 'four' for 2 + 2."]  # fmt: skip
    return [GenRequest(i, adapter, tuple(render_prompt([{"role": "user", "content": p}], engine.tokenizer, engine.base)),
                       SamplingParams(8, temperature, seed=i, answer=answer))
            for i, p in enumerate(prompts) for adapter in (None, "ft-a")]  # fmt: skip


@pytest.mark.parametrize("low,high", [(0, 1), (1, 7), (-5, 5), (10, 20)])
def test_the_untrained_stand_in_answers_a_number_in_the_range_only_when_constrained(engine, low, high):
    free = engine.generate(_requests(engine, None))
    assert sum(parse_score(r.text, low, high)[0] is not None for r in free) < len(free) / 2  # it answers words
    for temperature in (0.0, 1.0):
        results = engine.generate(_requests(engine, NumberAnswer(low, high), temperature=temperature))
        scores = [parse_score(r.text, low, high) for r in results]
        assert all(value is not None for value, _ in scores), [r.text for r in results]
        # An answer that ended by itself is a whole number of the strict grammar, in the range.
        assert all(is_number(r.text, low, high) for r in results if r.finish_reason == "stop"), [r.text for r in results]


def test_the_untrained_stand_in_answers_one_of_the_labels_when_constrained(engine):
    labels = ("yes", "no", "not sure")
    free = engine.generate(_requests(engine, None))
    assert not all(parse_label(r.text, labels)[0] is not None for r in free)
    for temperature in (0.0, 1.0):
        results = engine.generate(_requests(engine, ChoiceAnswer(labels), temperature=temperature))
        assert all(r.text in labels and r.finish_reason == "stop" for r in results), [r.text for r in results]
