"""The batch engine on the qwen2.5 stand-in with two random adapters, no Ray: its greedy tokens
equal plain transformers `generate` one row at a time with peft, each row gets its own adapter,
runs repeat exactly, and stops, lengths and seeds behave as OpenAI's parameters say."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoTokenizer

from catalog.bases import BASES, get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from catalog.standins import standin_dir
from openft.errors import InvalidRequest
from pipelines.generate import (
    GenRequest,
    SamplingParams,
    TransformersEngine,
    end_of_turn_ids,
    load_engine,
    render_prompt,
)
from pipelines.tokenize import tokenize_chat_row
from tests.factories import random_adapter

BASE_ID = "qwen2.5-0.5b-instruct"
TICKETS = ["My parcel never arrived.", "I was charged twice for one order.", "I cannot log in since Monday.",
           "Please cancel my subscription now", "The box came damaged and wet.", "Where is my refund?"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible CPU math, and the machine's cores are shared
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "model-cache"


@pytest.fixture(scope="module")
def base():
    return get_base(BASE_ID)


@pytest.fixture(scope="module")
def tokenizer(base, cache_root):
    return load_tokenizer(base, ModelSource("standin"), cache_root)


@pytest.fixture(scope="module")
def adapters(base, cache_root) -> dict[str, dict[str, bytes]]:
    return {"ft-a": random_adapter(base, cache_root, seed=1), "ft-b": random_adapter(base, cache_root, seed=2)}


@pytest.fixture(scope="module")
def engine(base, cache_root, adapters):
    return load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters, max_batch_rows=3)


@pytest.fixture(scope="module")
def reference_models(base, cache_root, adapters) -> dict:
    """Plain transformers models, one per adapter (peft on its own copy of the base)."""
    models = {None: load_model(base, ModelSource("standin"), cache_root).eval()}
    for name, files in adapters.items():
        with tempfile.TemporaryDirectory() as tmp:
            for filename, data in files.items():
                (Path(tmp) / filename).write_bytes(data)
            models[name] = PeftModel.from_pretrained(load_model(base, ModelSource("standin"), cache_root), tmp).eval()
    return models


def prompt(tokenizer, base, ticket: str) -> tuple[int, ...]:
    return tuple(render_prompt([{"role": "system", "content": "Label the ticket."}, {"role": "user", "content": ticket}], tokenizer, base))


def greedy(key, adapter, ids, max_tokens=10, **kw) -> GenRequest:
    return GenRequest(key, adapter, ids, SamplingParams(max_tokens=max_tokens, temperature=0, **kw))


def plain_generate(model, tokenizer, base, ids, max_tokens) -> list[int]:
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=list(end_of_turn_ids(tokenizer, base)), pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return out[0][len(ids) :].tolist()


@pytest.mark.parametrize("base_id", ["qwen2.5-0.5b-instruct", "qwen3-8b", "llama-3.1-8b-instruct", "mistral-7b-instruct-v0.3"])
def test_prompt_is_the_trainers_rendering_up_to_the_answer(base_id, cache_root):
    base = BASES[base_id]
    tok = AutoTokenizer.from_pretrained(standin_dir(base, cache_root))
    conversation = [{"role": "user", "content": "My parcel never arrived."}]
    trained = tokenize_chat_row(conversation + [{"role": "assistant", "content": "delivery"}], tok, base, 512, 1)
    ids = render_prompt(conversation, tok, base)
    assert trained.input_ids[: len(ids)] == ids
    # What follows the prompt in training is exactly the trained answer and its end-of-turn token.
    assert trained.labels[: len(ids)] == [-100] * len(ids)
    assert trained.labels[len(ids)] != -100
    assert end_of_turn_ids(tok, base)[0] in trained.labels


def test_prompt_refuses_control_tokens_by_position(tokenizer, base):
    with pytest.raises(InvalidRequest) as info:
        render_prompt([{"role": "user", "content": "hi <|im_end|> there"}], tokenizer, base, line_no=4)
    assert (info.value.code, info.value.param) == ("template_token_in_content", "body.messages")
    assert info.value.message.startswith("line 4, messages[0]") and "hi " not in info.value.message


def test_greedy_equals_plain_generate_row_by_row(engine, reference_models, tokenizer, base):
    # Seven rows over three slots: rows finish at different lengths and queued rows take their place.
    requests = [greedy(i, [None, "ft-a", "ft-b"][i % 3], prompt(tokenizer, base, TICKETS[i % 6] + " x" * i), max_tokens=4 + 2 * i)
                for i in range(7)]  # fmt: skip
    results = engine.generate(requests)
    assert [r.key for r in results] == list(range(7))
    for request, result in zip(requests, results):
        expected = plain_generate(reference_models[request.adapter], tokenizer, base, request.prompt_ids, request.params.max_tokens)
        assert list(result.token_ids) == expected, request.key
        assert (result.prompt_tokens, result.completion_tokens) == (len(request.prompt_ids), len(expected))
        assert result.finish_reason == "length" and result.text == tokenizer.decode(expected, skip_special_tokens=True)


def test_rows_that_wait_for_a_slot_answer_as_they_do_alone(engine, tokenizer, base):
    """More rows than slots, ending at different steps, so that waiting rows take freed slots: every
    row answers as it does alone. (A refill step used to make the rows already decoding take their
    last chosen token a second time; the base's answer, one token repeated, hid it.)"""
    requests = [greedy(i, ["ft-a", "ft-b"][i % 2], prompt(tokenizer, base, TICKETS[i % 6]), max_tokens=3 + i)
                for i in range(7)]  # fmt: skip
    alone = [engine.generate([r])[0] for r in requests]
    assert engine.generate(requests) == alone
    assert [r.completion_tokens for r in alone] == [3 + i for i in range(7)]


def test_each_row_gets_its_own_adapter(engine, reference_models, tokenizer, base):
    ids = prompt(tokenizer, base, TICKETS[0])
    results = engine.generate([greedy(k, name, ids, max_tokens=8) for k, name in enumerate(["ft-b", None, "ft-a"])])
    answers = {name: r.token_ids for name, r in zip(["ft-b", None, "ft-a"], results)}
    assert len(set(answers.values())) == 3  # the three models disagree on this prompt...
    for name, tokens in answers.items():  # ...and each row answered as its own model does
        assert list(tokens) == plain_generate(reference_models[name], tokenizer, base, ids, 8)


def test_greedy_runs_repeat_exactly(engine, tokenizer, base):
    requests = [greedy(i, ["ft-a", "ft-b", None][i % 3], prompt(tokenizer, base, t), max_tokens=12) for i, t in enumerate(TICKETS)]
    first = engine.generate(requests)
    assert engine.generate(requests) == first
    assert engine.generate(list(reversed(requests))) == list(reversed(first))


def test_stop_string_cuts_the_text(engine, tokenizer, base):
    ids = prompt(tokenizer, base, TICKETS[1])
    full = engine.generate([greedy(0, "ft-a", ids, max_tokens=12)])[0]
    stop = full.text[3:6]  # a piece of what the model says, so generation meets it
    assert stop.strip() and full.text.find(stop) == 3
    result = engine.generate([greedy(0, "ft-a", ids, max_tokens=12, stop=(stop, "never said"))])[0]
    assert result.finish_reason == "stop"
    assert result.text == full.text[:3]
    assert full.token_ids[: len(result.token_ids)] == result.token_ids and len(result.token_ids) < 12
    assert result.completion_tokens == len(result.token_ids)


def test_end_of_turn_stops_and_is_counted_but_not_written(engine, tokenizer, base):
    ids = prompt(tokenizer, base, TICKETS[2])
    full = engine.generate([greedy(0, None, ids, max_tokens=10)])[0]
    # The same model with a base whose end-of-turn token is the model's 3rd greedy token.
    eot = full.token_ids[2]
    stand_base = dataclasses.replace(base, end_of_turn=tokenizer.convert_ids_to_tokens(eot))
    other = TransformersEngine(engine.model, tokenizer, stand_base, aliases=engine.aliases)
    result = other.generate([greedy(0, None, ids, max_tokens=10)])[0]
    first = full.token_ids.index(eot)
    assert result.token_ids == full.token_ids[: first + 1] and result.finish_reason == "stop"
    assert result.completion_tokens == first + 1
    assert result.text == tokenizer.decode(full.token_ids[:first], skip_special_tokens=True)


def test_length_at_max_tokens_and_at_the_context(engine, tokenizer, base):
    ids = prompt(tokenizer, base, TICKETS[3])
    assert [r.finish_reason for r in engine.generate([greedy(0, "ft-b", ids, max_tokens=1)])] == ["length"]
    short = TransformersEngine(engine.model, tokenizer, dataclasses.replace(base, max_seq_length=len(ids) + 3), aliases=engine.aliases)
    result = short.generate([greedy(0, "ft-b", ids, max_tokens=50)])[0]
    assert (result.finish_reason, result.completion_tokens) == ("length", 3)


def test_sampling_is_seeded_per_request(engine, tokenizer, base):
    ids = prompt(tokenizer, base, TICKETS[4])

    def sample(key, seed, adapter="ft-a", top_p=1.0):
        return GenRequest(key, adapter, ids, SamplingParams(max_tokens=16, temperature=1.0, top_p=top_p, seed=seed))

    alone = engine.generate([sample(0, 7)])[0]
    # The same seed in a batch of other rows draws the same tokens; another seed draws others.
    batch = engine.generate([sample(0, 8), sample(1, 7), sample(2, 7, adapter="ft-b"), sample(3, 7, top_p=0.5)])
    assert batch[1].token_ids == alone.token_ids
    assert batch[0].token_ids != alone.token_ids
    assert batch[2].token_ids != alone.token_ids
    assert engine.generate([sample(3, 7, top_p=0.5)])[0].token_ids == batch[3].token_ids
    greedy_tokens = engine.generate([greedy(0, "ft-a", ids, max_tokens=16)])[0].token_ids
    assert alone.token_ids != greedy_tokens


def test_unknown_adapter_is_refused(engine, tokenizer, base):
    with pytest.raises(ValueError, match="not loaded"):
        engine.generate([greedy(0, "ft-c", prompt(tokenizer, base, TICKETS[0]))])
