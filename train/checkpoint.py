"""Checkpoints in the object store: adapter weights, optimizer state, data position, RNG states.

Where it sits: the training loop (train/loop.py) writes one at each epoch end and on pause, and
reads the latest one when a job resumes, in the same Ray Train run after a lost worker or in a new
run after a pause. Layout under the job's `checkpoint_prefix`:

    step-00000042/adapter.safetensors   LoRA weights by parameter name
    step-00000042/state.pt              optimizer state, RNG states, the loop's progress counters
    step-00000042/meta.json             written last: a checkpoint without it is incomplete and ignored

Only the newest complete checkpoint is kept: older ones are deleted once a newer one is whole.
The batch order of an epoch is a pure function of (seed, epoch) (train/data.py), so the position
is just (epoch, next batch index) and a resumed run replays exactly what the uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import orjson
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from train.lora import load_state, save_state

META = "meta.json"


@dataclass
class Checkpoint:
    key: str  # the checkpoint's prefix in the store
    adapter: dict[str, torch.Tensor]
    optimizer: dict
    progress: dict  # epoch, batch, step and the loop's running sums (see loop.Progress)
    rng: dict


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(store, prefix: str, step: int, adapter: dict[str, torch.Tensor], optimizer: dict, progress: dict) -> str:
    key = f"{prefix}step-{step:08d}/"
    store.put_bytes(key + "adapter.safetensors", save_safetensors({k: v.contiguous() for k, v in adapter.items()}))
    store.put_bytes(key + "state.pt", save_state({"optimizer": optimizer, "rng": rng_state(), "progress": progress}))
    store.put_bytes(key + META, orjson.dumps({"step": step, "epoch": progress["epoch"], "batch": progress["batch"]}))
    for older in _complete(store, prefix):
        if older != key:
            store.delete_prefix(older)
    return key


def _complete(store, prefix: str) -> list[str]:
    return [k[: -len(META)] for k in store.list(prefix) if k.endswith("/" + META)]


def latest_checkpoint(store, prefix: str) -> str | None:
    """The newest complete checkpoint's key (step numbers are zero-padded, so sorted order is step order)."""
    keys = _complete(store, prefix)
    return keys[-1] if keys else None


def load_checkpoint(store, key: str) -> Checkpoint:
    adapter = load_safetensors(store.get_bytes(key + "adapter.safetensors"))
    state = load_state(store.get_bytes(key + "state.pt"))
    return Checkpoint(key, adapter, state["optimizer"], state["progress"], state["rng"])
