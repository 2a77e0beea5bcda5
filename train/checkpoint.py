"""Checkpoints in the object store: adapter weights, optimizer state, data position, RNG states.

Where it sits: the training loop (train/loop.py) writes one at each epoch end and on pause, and
reads the latest one when a job resumes, in the same Ray Train run after a lost worker or in a new
run after a pause. Layout under the job's `checkpoint_prefix` (storage/keys.py `checkpoint`):

    step-00000042/adapter_model.safetensors  the LoRA weights in peft's format (train/lora.py adapter_files)
    step-00000042/adapter_config.json        so each kept checkpoint is a model: downloadable and usable
                                             in a batch by its name (jobs/model_names.py)
    step-00000042/state.pt                   optimizer state, RNG states, the loop's progress counters
    step-00000042/meta.json                  written last: a checkpoint without it is incomplete and ignored;
                                             it carries the adapter files' SHA-256 and sizes (downloads send them)

What is kept (`prune_checkpoints`, run once the checkpoint's event is recorded): the adapters of
the `CHECKPOINTS_KEPT` newest complete checkpoints, and the optimizer state of the newest only (a
resume needs no other). The reaper deletes the rest with the run's copies, 7 days after the job ends.
The batch order of an epoch is a pure function of (seed, epoch) (train/data.py), so the position
is just (epoch, next batch index) and a resumed run replays exactly what the uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import orjson
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from jobs.model_names import CHECKPOINTS_KEPT
from storage import keys
from train.lora import ADAPTER_WEIGHTS, load_state, save_state

META = keys.CHECKPOINT_META
STATE = "state.pt"
LEGACY_ADAPTER = "adapter.safetensors"  # raw parameter names: checkpoints written before issue 13


@dataclass
class Checkpoint:
    key: str  # the checkpoint's prefix in the store
    adapter: dict[str, torch.Tensor]  # peft's keys (or, legacy, parameter names): train/lora.py load_adapter_weights
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


def save_checkpoint(store, prefix: str, step: int, adapter: dict[str, bytes], optimizer: dict, progress: dict) -> str:
    """Store one checkpoint; `adapter` is peft's two files (train/lora.py adapter_files). Prunes nothing:
    the loop calls `prune_checkpoints` once the checkpoint's event is recorded, so the database never
    names a checkpoint among the kept ones whose files are already gone."""
    key = prefix + keys.checkpoint_dir(step)
    for name, data in sorted(adapter.items()):
        store.put_bytes(key + name, data)
    store.put_bytes(key + STATE, save_state({"optimizer": optimizer, "rng": rng_state(), "progress": progress}))
    files = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in adapter.items()}
    store.put_bytes(key + META, orjson.dumps({"step": step, "epoch": progress["epoch"], "batch": progress["batch"],
                                              "files": files}))
    return key


def prune_checkpoints(store, prefix: str, keep: int = CHECKPOINTS_KEPT) -> None:
    """Delete all but the `keep` newest complete checkpoints, and the optimizer state of all but the newest."""
    complete = _complete(store, prefix)
    for older in complete[:-keep]:
        store.delete_prefix(older)
    for older in complete[-keep:-1]:
        store.delete(older + STATE)


def _complete(store, prefix: str) -> list[str]:
    return sorted(k[: -len(META)] for k in store.list(prefix) if k.endswith("/" + META))



def latest_checkpoint(store, prefix: str) -> str | None:
    """The newest complete checkpoint's key (step numbers are zero-padded, so sorted order is step order)."""
    keys = _complete(store, prefix)
    return keys[-1] if keys else None


def load_checkpoint(store, key: str) -> Checkpoint:
    name = LEGACY_ADAPTER if store.exists(key + LEGACY_ADAPTER) else ADAPTER_WEIGHTS
    adapter = load_safetensors(store.get_bytes(key + name))
    state = load_state(store.get_bytes(key + STATE))
    return Checkpoint(key, adapter, state["optimizer"], state["progress"], state["rng"])
