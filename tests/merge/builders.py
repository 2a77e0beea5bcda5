"""Builders for merge tests: stand-in bases (single file or a sharded mirror), real peft LoRA
adapters trained on them, adapters edited into malformed ones, and stores holding them."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load, save
from transformers import AutoModelForCausalLM

from catalog.bases import BaseModelSpec
from catalog.model_source import REVISION_MARKER
from merge.errors import MergeError
from merge.plan import pinned_path
from merge.run import ADAPTER_CONFIG, ADAPTER_MODEL, MergeRequest, run_merge
from storage.objects import open_object_store


@dataclass
class Adapter:
    config: bytes
    model: bytes

    def tensors(self) -> dict[str, torch.Tensor]:
        return load(self.model)

    def with_config(self, **changes) -> "Adapter":
        config = json.loads(self.config)
        config.update(changes)
        return Adapter(json.dumps(config).encode(), self.model)

    def with_tensors(self, tensors: dict[str, torch.Tensor]) -> "Adapter":
        return Adapter(self.config, save(tensors))

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ADAPTER_CONFIG).write_bytes(self.config)
        (directory / ADAPTER_MODEL).write_bytes(self.model)
        return directory

    def sha256(self) -> dict[str, str]:
        return {ADAPTER_CONFIG: hashlib.sha256(self.config).hexdigest(), ADAPTER_MODEL: hashlib.sha256(self.model).hexdigest()}


def train_adapter(base_dir: Path, base: BaseModelSpec, tmp: Path, *, seed: int = 0, **lora) -> Adapter:
    """A real peft LoRA adapter of the base in `base_dir` with random non-zero lora_A and lora_B."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    settings = dict(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, revision=base.revision)
    settings.update(lora)
    peft_model = get_peft_model(model, LoraConfig(**settings))
    out = tmp / f"adapter-{seed}-{abs(hash(json.dumps(lora, sort_keys=True, default=str))) % 10**8}"
    peft_model.save_pretrained(out)
    return Adapter((out / ADAPTER_CONFIG).read_bytes(), (out / ADAPTER_MODEL).read_bytes())


def store_request(tmp: Path, base: BaseModelSpec, adapter: Adapter, *, model_source: str, cache_root: Path,
                  **kw) -> MergeRequest:  # fmt: skip
    store = open_object_store((tmp / "objects").as_uri())
    store.put_bytes(f"adapters/a1/{ADAPTER_CONFIG}", adapter.config)
    store.put_bytes(f"adapters/a1/{ADAPTER_MODEL}", adapter.model)
    return MergeRequest(
        base_id=base.id,
        model_source=model_source,
        cache_root=str(cache_root),
        store_spec=store.spec(),
        adapter_prefix="adapters/a1",
        export_prefix="exports/m1",
        **kw,
    )


def sharded_mirror(standin: Path, base: BaseModelSpec, root: Path, cache_root: Path, *, max_shard_size: str = "400KB",
                   dtype: torch.dtype = torch.bfloat16) -> Path:  # fmt: skip
    """A `dir:` mirror of the stand-in saved in several shards, with operator-pinned digests."""
    target = root / base.hf_repo
    model = AutoModelForCausalLM.from_pretrained(standin, dtype=dtype)
    model.save_pretrained(target, max_shard_size=max_shard_size)
    for p in standin.iterdir():
        if p.is_file() and not (target / p.name).exists() and not p.name.startswith(("model", "openft_")):
            shutil.copy(p, target / p.name)
    (target / REVISION_MARKER).write_text(base.revision)
    pin_digests(target, base, cache_root)
    return target


def pin_digests(mirror: Path, base: BaseModelSpec, cache_root: Path, extra: dict[str, str] | None = None) -> None:
    """Pin the mirror's files as they are now (plus `extra` entries), as an operator would."""
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in mirror.iterdir() if p.name != REVISION_MARKER}
    pinned = pinned_path(base, cache_root)
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_text(json.dumps({"base": base.id, "revision": base.revision, "files": {**files, **(extra or {})}}))


def failed_code(req: MergeRequest, store=None) -> str:
    """The MergeError code `run_merge(req, store)` fails with."""
    with pytest.raises(MergeError) as err:
        run_merge(req, store)
    return err.value.code
