"""The models the serving-parity check (train/parity.py) generates with, and greedy decoding that
keeps each step's top logits.

- The training-time model: the base as train/lora.py loads it, wrapped by peft with the JOB's own
  rank and alpha (`lora_config_for`, not adapter_config.json's), the adapter's tensors loaded,
  unmerged. For a QLoRA job the base is loaded unquantized: batches serve a QLoRA adapter on the
  full-precision base (the reference says its outputs "can differ slightly" from training's), so
  comparing against a 4-bit base would refuse every QLoRA fine-tune for the quantization, not for
  anything serving gets wrong.
- The merged model: the base's shards with `W + B·A × lora_alpha / r` added by merge/shard.py's
  `merge_shard` (the code that builds merged-weight exports, adapter_config.json's scale), written
  into a temporary directory with the base's other files, then loaded like any base.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from catalog.bases import BaseModelSpec
from catalog.model_source import import_peft, load_model, parse_model_source, resolve_base_dir
from merge.adapter import validate_adapter
from merge.plan import build_plan, pinned_digests
from merge.shard import copy_file, merge_shard
from storage.objects import open_object_store
from train.lora import lora_config_for, read_adapter_weights

TOP_K = 16  # logits kept per step: enough to price a divergence between near-tied tokens


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int, ...]  # greedy tokens, the end-of-turn token included when it stopped there
    top_ids: tuple[tuple[int, ...], ...]  # per step, the TOP_K token ids, highest logit first
    top_logits: tuple[tuple[float, ...], ...]  # their logits (fp32)


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    """What training uses: bf16 on a GPU, fp32 on CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    return torch.device("cpu"), torch.float32


def training_model(base: BaseModelSpec, model_source: str, cache_root: Path, weights: bytes, rank: int, alpha: int):
    device, dtype = device_and_dtype()
    peft = import_peft()
    model = load_model(base, parse_model_source(model_source), cache_root, dtype=dtype).to(device)
    peft_model = peft.get_peft_model(model, lora_config_for(rank, alpha, base))
    result = peft.set_peft_model_state_dict(peft_model, read_adapter_weights(weights))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError("the adapter's tensors do not match the job's LoRA modules")
    return peft_model.to(device).eval()


def merged_model(base: BaseModelSpec, model_source: str, cache_root: Path, config: bytes, weights: bytes, workdir: Path):
    """The base with the adapter merged into its weights, written under `workdir` and loaded."""
    adapter = validate_adapter(config, lambda s, e: weights[s:e], len(weights), base)
    base_dir = resolve_base_dir(base, parse_model_source(model_source), cache_root)
    plan = build_plan(adapter, base_dir, pinned_digests(base, parse_model_source(model_source), base_dir, cache_root))
    out = Path(tempfile.mkdtemp(prefix="parity-merged-", dir=workdir))
    store = open_object_store(f"file://{out}")
    array = np.frombuffer(weights, dtype=np.uint8)
    for shard in plan.shards:
        merge_shard(shard, str(base_dir / shard.path), store, shard.path, array, adapter.scale)
    for path, sha256 in plan.files:  # config, index, tokenizer: small, and checked against their pins too
        copy_file(str(base_dir / path), path, sha256, store, path)
    device, dtype = device_and_dtype()
    return AutoModelForCausalLM.from_pretrained(out, dtype=dtype).to(device).eval()


@torch.no_grad()
def greedy(model, prompt_ids: list[int], max_tokens: int, stop_id: int) -> Completion:
    """Greedy decoding with a KV cache; ties go to the lowest token id (torch.argmax)."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    tokens, top_ids, top_logits = [], [], []
    for _ in range(max_tokens):
        logits = out.logits[0, -1].float()
        token = int(torch.argmax(logits))
        top = torch.topk(logits, min(TOP_K, logits.numel()))
        tokens.append(token)
        top_ids.append(tuple(int(i) for i in top.indices))
        top_logits.append(tuple(float(v) for v in top.values))
        if token == stop_id:
            break
        out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return Completion(tuple(tokens), tuple(top_ids), tuple(top_logits))
