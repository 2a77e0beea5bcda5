"""Comparing greedy answers across batch compositions.

A row decoded beside other rows goes through other CPU kernels than a row alone (a one-row matrix
product is not a many-row one), so where a model's two best next tokens are within float noise of
each other the greedy choice can tip. Random test adapters have flat logits and meet such ties;
trained ones rarely do. `same_or_tie` accepts a difference only at such a tie, by the parity check's
tolerance (Settings.parity_logit_tolerance): a row that ran another adapter differs by far more."""

from __future__ import annotations

TIE = 0.05


def same_or_tie(engine, prompt_ids, adapter: str | None, want, got: str) -> bool:
    """`got` is the text of `want` (a GenResult of `engine`, the reference), or leaves it at a token
    where the reference's top two logits are within TIE."""
    import torch

    if got == want.text:
        return True
    tokens = list(want.token_ids)
    k = next((i for i in range(len(tokens)) if not got.startswith(engine._text(tokens[: i + 1]))), None)
    if k is None:  # `got` continues past the reference's end: it differs where the reference ended
        k = len(tokens) - 1
    with torch.inference_mode():
        ids = torch.tensor([list(prompt_ids) + tokens[:k]])
        top = torch.topk(engine._forward([adapter], input_ids=ids).logits[0, -1], 2).values
    return float(top[0] - top[1]) <= TIE
