"""The model a recipe trains: the base (bf16 on GPU, fp32 on CPU, or 4-bit NF4 for QLoRA) with a peft
LoRA adapter on its attention and MLP projections, and the adapter's files.

Target modules per family (every Linear projection of attention and MLP; never embeddings or the
LM head, so the adapter merges on bases with a tied head):
- qwen2.5, qwen3, mistral, llama3.1: q/k/v/o_proj, gate/up/down_proj.
- qwen3.5: the full-attention layers' q/k/v/o_proj, the gated-delta-net layers' in_proj_qkv,
  in_proj_z and out_proj (in_proj_a / in_proj_b only produce per-head gates, a few columns wide),
  and gate/up/down_proj.
- gpt-oss: q/k/v/o_proj only. Its experts are fused 3-D parameters (`experts.gate_up_proj`,
  `experts.down_proj`), not Linear modules: adapting them needs peft's `target_parameters`,
  whose weights are not the plain lora_A/lora_B-of-a-Linear pairs the merge and the model registry
  accept. The router is left alone too: changing which experts a token picks from a small dataset
  is a known way to destabilise MoE fine-tunes.

The adapter starts as the identity (peft initialises lora_B to zero) with no dropout, so a run is
a deterministic function of its seed and data, and DPO's loss starts at exactly ln 2.

The model stays in training mode for evals too (under no_grad): no base here has dropout and the
adapter has none, so the math is the same, and bitsandbytes 0.50 repacks a 4-bit layer's weights
on CPU into an inference-only layout at its first eval-mode forward, after which a training
forward fails (`result += bias` on a leaf that requires grad).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from catalog.bases import BaseModelSpec
from catalog.model_source import import_peft, load_model, parse_model_source
from openft.errors import TrainingError
from train.config import TrainJob

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

_DENSE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGET_MODULES: dict[str, list[str]] = {
    "qwen2.5": _DENSE,
    "qwen3": _DENSE,
    "mistral": _DENSE,
    "llama3.1": _DENSE,
    "qwen3.5": _DENSE + ["in_proj_qkv", "in_proj_z", "out_proj"],
    "gpt-oss": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
LONG_CONTEXT = 2048  # above this, activations are recomputed in backward (gradient checkpointing)


def pick_device(job: TrainJob) -> torch.device:
    if job.device == "cuda" or (job.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainingError("training_failed", "The job asks for a GPU but this worker has none.")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def autocast(device: torch.device):
    """bf16 autocast on GPU (the LoRA weights stay fp32); plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lora_config(job: TrainJob, base: BaseModelSpec) -> LoraConfig:
    return lora_config_for(job.lora_rank, job.lora_alpha, base)


def lora_config_for(rank: int, alpha: int, base: BaseModelSpec) -> LoraConfig:
    """The one LoRA config training uses (train/parity.py rebuilds the training-time model with it)."""
    return import_peft().LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=TARGET_MODULES[base.family],
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base.id,
        revision=base.revision,
    )


def build_model(job: TrainJob, base: BaseModelSpec, device: torch.device) -> PeftModel:
    """The base with a fresh adapter, on `device`. Seeds torch first: the adapter's lora_A init is random."""
    peft = import_peft()  # before a 4-bit load imports bitsandbytes (catalog/model_source.py says why)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    source = parse_model_source(job.model_source)
    if job.adapter == "qlora":
        try:
            model = load_model(base, source, Path(job.cache_root), dtype=dtype, quantization="nf4")
        except (ImportError, RuntimeError, NotImplementedError) as exc:
            # Never fall back to bf16 LoRA silently: the job asked for (and was quoted) QLoRA.
            raise TrainingError(
                "training_failed", f"QLoRA could not load {base.id} in 4-bit NF4 on {device.type} ({type(exc).__name__})."
            ) from exc
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=job.max_seq_length > LONG_CONTEXT)
    else:
        model = load_model(base, source, Path(job.cache_root), dtype=dtype)
        if job.max_seq_length > LONG_CONTEXT:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
    model.config.use_cache = False
    if job.adapter != "qlora" or device.type == "cuda":
        model.to(device)  # bitsandbytes places 4-bit weights itself on GPU; on CPU they stay put
    torch.manual_seed(job.seed)
    peft_model = peft.get_peft_model(model, lora_config(job, base))
    peft_model.to(device)
    return peft_model.train()  # from_pretrained returns eval mode; see the module docstring for why it stays in train


def trainable_parameters(model: PeftModel) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """The LoRA weights by parameter name (as they are in the model, adapter name included)."""
    return {name: p.detach().to("cpu").clone() for name, p in model.named_parameters() if p.requires_grad}


def load_adapter_state(model: PeftModel, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    if set(state) != {n for n, p in params.items() if p.requires_grad}:
        raise TrainingError("training_failed", "The checkpoint's adapter does not match this job's model and rank.")
    with torch.no_grad():
        for name, tensor in state.items():
            params[name].copy_(tensor)


def load_adapter_weights(model: PeftModel, weights: dict[str, torch.Tensor]) -> None:
    """Load peft-format weights (adapter_model.safetensors' keys, which drop the adapter's name) into
    the training model, exactly; parameter-name keys (checkpoints written before issue 13) load as they are."""
    adapter = model.active_adapter
    names = {n.replace(f".{adapter}.", "."): n for n, p in model.named_parameters() if p.requires_grad}
    if set(weights) <= set(names):
        weights = {names[k]: v for k, v in weights.items()}
    load_adapter_state(model, weights)


def adapter_files(model: PeftModel, base: BaseModelSpec) -> dict[str, bytes]:
    """peft's standard adapter_model.safetensors and adapter_config.json; the config names our base id
    (`base_model_name_or_path`) and its pinned `revision`."""
    weights = {k: v.detach().to("cpu").contiguous() for k, v in import_peft().get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    config["base_model_name_or_path"] = base.id
    config["revision"] = base.revision
    config["target_modules"] = sorted(config["target_modules"])  # a set in peft: fixed order for stable bytes
    return {
        ADAPTER_WEIGHTS: save_safetensors(weights, metadata={"format": "pt"}),
        ADAPTER_CONFIG: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
    }


def read_adapter_weights(data: bytes) -> dict[str, torch.Tensor]:
    return load_safetensors(data)


def save_state(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def load_state(data: bytes) -> object:
    return torch.load(io.BytesIO(data), weights_only=True)
