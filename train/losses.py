"""Log-probabilities of the label tokens, and the two losses built on them (SFT cross-entropy, DPO).

Where it sits: called by the recipes' steps and evals. The decoder runs once over the padded batch
and the LM head only at positions whose next token is a label: on a 150k vocabulary the logits of
context tokens would cost more memory than the rest of the step. Above `CHUNK` label positions the
head runs in checkpointed chunks, so a long answer never holds all its logits at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pipelines.tokenize import IGNORE_INDEX

CHUNK = 4096  # label positions per LM-head chunk


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    # A PeftModel wraps the transformers model; its LoRA layers live inside it either way.
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()
    return torch.gather(F.log_softmax(logits, dim=-1), 1, targets[:, None]).squeeze(1)


def label_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each label token, the batch row it belongs to), label positions in row-major order."""
    causal = _causal_lm(model)
    hidden = causal.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    targets = batch["labels"][:, 1:]
    selected = targets != IGNORE_INDEX
    rows = torch.nonzero(selected)[:, 0]
    hidden, targets = hidden[:, :-1][selected], targets[selected]
    if hidden.shape[0] <= CHUNK:
        return _head_logprobs(causal.lm_head, hidden, targets), rows
    parts = [
        checkpoint(_head_logprobs, causal.lm_head, hidden[i : i + CHUNK], targets[i : i + CHUNK], use_reentrant=False)
        for i in range(0, hidden.shape[0], CHUNK)
    ]
    return torch.cat(parts), rows


def cross_entropy_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the label tokens, how many there are)."""
    logprobs, _ = label_logprobs(model, batch)
    return -logprobs.sum(), logprobs.numel()


def sequence_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per row: the summed log p of its label tokens (a DPO completion given its prompt)."""
    logprobs, rows = label_logprobs(model, batch)
    out = torch.zeros(batch["input_ids"].shape[0], dtype=logprobs.dtype, device=logprobs.device)
    return out.index_add(0, rows, logprobs)


def dpo_losses(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per pair: -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))); ln 2 while policy == reference."""
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return -F.logsigmoid(beta * margin)
