"""Stacked LoRA (pipelines/lora_stack.py) against peft's own mixed-adapter forward on the same
model: rows of the base and of adapters of different ranks and target modules in one forward give
the same logits, after adapters are removed and added too; a kind of adapter it does not stack
(a LoRA bias) leaves the engine on peft's path."""

from __future__ import annotations

import pytest
import torch

from catalog.model_source import ModelSource, load_model
from pipelines.generate import TransformersEngine, load_engine
from tests.pipelines.test_generate import TICKETS, base, cache_root, one_thread, prompt, tokenizer  # noqa: F401 (fixtures)
from train.lora import TARGET_MODULES, adapter_files


def make_adapter(base, cache_root, seed: int, rank: int, targets: list[str] | None = None, **config):
    from peft import LoraConfig, get_peft_model

    model = load_model(base, ModelSource("standin"), cache_root)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=3 * rank, target_modules=targets or TARGET_MODULES[base.family],
                        init_lora_weights=False, task_type="CAUSAL_LM", **config)  # fmt: skip
    return adapter_files(get_peft_model(model, config), base)


def rows(tokenizer, base, n: int) -> torch.Tensor:
    """n prompts cut to one length, so they stack without padding."""
    prompts = [prompt(tokenizer, base, TICKETS[i % len(TICKETS)]) for i in range(n)]
    width = min(len(p) for p in prompts)
    return torch.tensor([p[-width:] for p in prompts])


def logits(engine, adapters, ids) -> torch.Tensor:
    with torch.inference_mode():
        return engine._forward(adapters, input_ids=ids).logits


def test_stacked_rows_answer_as_pefts_mixed_forward(base, cache_root, tokenizer):
    adapters = {"ft-a": make_adapter(base, cache_root, 1, rank=8),
                "ft-b": make_adapter(base, cache_root, 2, rank=4),  # a smaller rank: a zero-padded block
                "ft-c": make_adapter(base, cache_root, 3, rank=8, targets=["q_proj", "v_proj"])}  # other layers: zero blocks
    stacked = load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters)
    assert stacked._stack is not None and stacked._stack.usable
    peft_path = TransformersEngine(stacked.model, tokenizer, base, aliases=stacked.aliases)  # the same model, peft's forward
    names = [None, "ft-a", "ft-b", "ft-c", "ft-a", None]
    ids = rows(tokenizer, base, len(names))
    want, got = logits(peft_path, names, ids), logits(stacked, names, ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # Each adapter moves its rows' logits: no row ran another's weights.
    assert (want[1] - want[0]).abs().max() > 1e-2 and (want[3] - want[2]).abs().max() > 1e-2
    # One token per row (a decode step's shape), every row the base: no LoRA term at all.
    torch.testing.assert_close(logits(stacked, [None] * 3, ids[:3, -1:]), logits(peft_path, [None] * 3, ids[:3, -1:]))

    # Adapters removed and added while loaded: the stacks follow.
    stacked.remove_adapter("ft-b")
    stacked.add_adapter("ft-d", make_adapter(base, cache_root, 4, rank=16))
    names = ["ft-d", "ft-c", None, "ft-a"]
    ids = rows(tokenizer, base, len(names))
    torch.testing.assert_close(logits(stacked, names, ids), logits(peft_path, names, ids), atol=1e-4, rtol=1e-4)
    with pytest.raises(KeyError):
        logits(stacked, ["ft-b"], ids[:1])


def test_an_adapter_it_cannot_stack_keeps_pefts_path(base, cache_root, tokenizer):
    adapters = {"ft-a": make_adapter(base, cache_root, 1, rank=8), "ft-bias": make_adapter(base, cache_root, 5, rank=8, lora_bias=True)}
    engine = load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters)
    assert not engine._stack.usable
    names = ["ft-bias", "ft-a"]
    ids = rows(tokenizer, base, len(names))
    peft_path = TransformersEngine(engine.model, tokenizer, base, aliases=engine.aliases)
    torch.testing.assert_close(logits(engine, names, ids), logits(peft_path, names, ids))
