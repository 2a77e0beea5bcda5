"""A run's data source checked at create (evals/source.py), without a database: the messages each
item gives the model, the sampling parameters' bounds, item references checked against the item
schema, the quote's token bound (the batch scan's rule per request) and the rate of the dearest
base a run uses. Refusals through the API are tests/serve_app/test_eval_runs_api.py's."""

from __future__ import annotations

import orjson
import pytest

from batches.scan import tokens_upper_bound
from catalog.bases import BASES
from evals import samples, source
from jobs.model_names import ResolvedModel
from openft.errors import InvalidRequest

BASE, OTHER = "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct"
SCHEMA = {"type": "object", "properties": {"question": {"type": "string"},
                                           "chat": {"type": "array", "items": {"type": "object"}}}}
TEMPLATE = {"type": "template", "template": [{"role": "developer", "content": "Be brief."},
                                             {"role": "user", "content": "Q: {{item.question}}"}]}
ITEMS = [{"item": {"question": "capital of France?", "chat": [{"role": "user", "content": "hi"}]}}]


def resolve(name: str) -> ResolvedModel | None:
    return ResolvedModel(name, name, "base", None, True, None) if name in BASES else None


def parse(data_source: dict, criteria=(), rate=lambda base: 1.0):
    return source.parse(data_source, item_schema=SCHEMA, criteria=list(criteria), resolve=resolve,
                        read_file=lambda file_id: b"", rate=rate)


def completions(**overrides) -> dict:
    return {"type": "completions", "model": BASE, "input_messages": TEMPLATE,
            "sampling_params": {"max_completion_tokens": 8},
            "source": {"type": "file_content", "content": ITEMS}, **overrides}


def test_a_template_renders_each_items_messages_and_bounds_the_quote_as_a_batch_line():
    found = parse(completions())
    sampling = found.plan.sampling
    assert (sampling.model, sampling.base_id, sampling.temperature, sampling.max_tokens) == (BASE, BASE, 1.0, 8)
    messages = samples.messages_for(sampling, ITEMS[0]["item"])
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: capital of France?"}]
    prompt = len(orjson.dumps(ITEMS[0]["item"])) + len(b"Be brief.") + len(b"Q: {{item.question}}")
    assert found.plan.tokens_upper_bound == tokens_upper_bound(BASE, prompt, 2, 8)
    assert found.plan.rate_base_id == BASE and found.items == ITEMS


def test_an_item_reference_names_each_items_own_messages():
    found = parse(completions(input_messages={"type": "item_reference", "item_reference": "item.chat"}))
    assert samples.messages_for(found.plan.sampling, ITEMS[0]["item"]) == ITEMS[0]["item"]["chat"]
    assert samples.messages_for(found.plan.sampling, {"question": "no chat"}) is None  # its line says so


@pytest.mark.parametrize(("overrides", "code", "param"), [
    ({"input_messages": {"type": "item_reference", "item_reference": "item.history"}}, "invalid_template",
     "data_source.input_messages.item_reference"),
    ({"input_messages": {"type": "template", "template": [{"role": "user", "content": "{{sample.output_text}}"}]}},
     "invalid_template", "data_source.input_messages.template[0].content"),
    ({"input_messages": {"type": "template", "template": [{"role": "tool", "content": "x"}]}}, "invalid_value",
     "data_source.input_messages.template[0].role"),
    ({"sampling_params": {"temperature": 3}}, "invalid_value", "data_source.sampling_params.temperature"),
    ({"sampling_params": {"max_completion_tokens": 0}}, "invalid_value",
     "data_source.sampling_params.max_completion_tokens"),
    ({"sampling_params": {"reasoning_effort": "low"}}, "unknown_parameter", "data_source.sampling_params.reasoning_effort"),
    ({"source": {"type": "file_content", "content": []}}, "empty_file", "data_source.source.content"),
    ({"source": {"type": "stored", "id": "x"}}, "invalid_value", "data_source.source.type"),
    ({"model": None}, "missing_required_parameter", "data_source.model"),
])
def test_refusals_name_their_param(overrides, code, param):
    with pytest.raises(InvalidRequest) as info:
        parse(completions(**overrides))
    assert (info.value.code, info.value.param) == (code, param)


def test_too_many_items_are_refused_and_the_dearest_base_sets_the_rate():
    with pytest.raises(InvalidRequest) as info:
        parse(completions(source={"type": "file_content", "content": ITEMS * (source.MAX_ITEMS + 1)}))
    assert info.value.param == f"data_source.source.content[{source.MAX_ITEMS}]"
    judge = {"type": "label_model", "name": "judge", "model": OTHER, "labels": ["a"], "passing_labels": ["a"],
             "input": []}
    found = parse(completions(), criteria=[{"type": "multi", "name": "m", "graders": {"judge": judge},
                                            "calculate_output": "judge"}],
                  rate=lambda base: {BASE: 1.0, OTHER: 2.0}[base])
    assert found.plan.rate_base_id == OTHER
    assert found.plan.tokens_upper_bound == parse(completions()).plan.tokens_upper_bound + BASES[OTHER].max_seq_length
