"""run_merge end to end on real Ray: merged weights equal peft's merge_and_unload and
W + B·A × scale rounded once to bf16; unadapted files stay byte-identical; the export carries its
licence, NOTICE and manifest; failures delete the export; a re-run writes the same bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from catalog.bases import get_base
from catalog.model_source import parse_model_source
from catalog.standins import MANIFEST, standin_dir
from merge.plan import build_plan, pinned_digests
from merge.run import MergeRequest, _load_adapter, run_merge
from merge.shard import merge_shard
from storage.objects import open_object_store
from tests.merge.builders import Adapter, failed_code, sharded_mirror, store_request, train_adapter
from tests.merge.corrupting_store import CorruptingStore, DyingStore

pytestmark = pytest.mark.usefixtures("ray_cluster")
IDS = torch.tensor([[5, 17, 300, 2999, 42, 7, 1024, 64]])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _export_dir(req: MergeRequest) -> Path:
    return open_object_store(*req.store_spec).root / req.export_prefix


def _expected(base_dir: Path, adapter: Adapter) -> dict[str, torch.Tensor]:
    """W + B·A × lora_alpha / r in fp32, rounded once to bf16, for every adapted weight."""
    config = json.loads(adapter.config)
    scale = config["lora_alpha"] / config["r"]
    factors = adapter.tensors()
    weights = {}
    for shard in base_dir.glob("model*.safetensors"):
        with safe_open(shard, "pt") as f:
            weights.update({k: f.get_tensor(k) for k in f.keys()})
    out = {}
    for name, a in factors.items():
        if ".lora_A." in name:
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = factors[name.replace(".lora_A.", ".lora_B.")]
            out[f"{module}.weight"] = (weights[f"{module}.weight"].float() + (b.float() @ a.float()) * scale).to(torch.bfloat16)
    return out


def _merged_tensors(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in directory.glob("model*.safetensors"):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_merge_equals_peft_merge_and_unload(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, base_dir = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache,
                        adapter_sha256=qwen7b_adapter.sha256())  # fmt: skip
    result = run_merge(req)
    out = _export_dir(req)

    merged = _merged_tensors(out)
    expected = _expected(base_dir, qwen7b_adapter)
    assert len(expected) == 14  # all-linear on two layers
    for name, tensor in expected.items():
        assert torch.equal(merged[name], tensor), name

    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16), qwen7b_adapter.write(tmp_path / "ad")
    ).merge_and_unload()
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    theirs = peft_model.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, peft_model(IDS).logits)
        unmerged = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)(IDS).logits
    assert not torch.equal(ours(IDS).logits, unmerged)

    base_files = json.loads((base_dir / MANIFEST).read_text())["files"]
    for name, digest in base_files.items():
        if name != "model.safetensors":
            assert _sha(out / name) == digest, name
    assert (out / "LICENSE").read_bytes().startswith(b"\n                                 Apache License")
    notice = (out / "NOTICE").read_text()
    assert "14 weights were replaced by W + B·A × lora_alpha / r (r = 4, lora_alpha = 8)" in notice
    assert "Modified files: model.safetensors." in notice

    manifest = json.loads((out / "gridline_merge.json").read_text())
    assert manifest["base"] == base.id and manifest["revision"] == base.revision
    assert manifest["modified"] == ["model.safetensors"]
    assert manifest["adapter"]["sha256"] == qwen7b_adapter.sha256()
    assert manifest["adapter"]["scale"] == 2.0
    assert manifest["added"] == ["LICENSE", "NOTICE", "gridline_merge.json"]
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == set(base_files) | {"LICENSE", "NOTICE"}
    for path, entry in listed.items():
        assert entry["sha256"] == _sha(out / path) and entry["bytes"] == (out / path).stat().st_size
        assert entry["modified"] is (path == "model.safetensors")
    assert {f["path"] for f in result.files} == set(listed) | {"gridline_merge.json"}
    assert result.manifest == manifest


def test_sharded_base_keeps_layout_and_rerun_is_identical(tmp_path, qwen7b, model_cache):
    base, standin = qwen7b
    cache_root = tmp_path / "cache"
    mirror = sharded_mirror(standin, base, tmp_path / "mirror", cache_root)
    shards = sorted(p.name for p in mirror.glob("model-*.safetensors"))
    assert len(shards) >= 3
    # Only layer 1's attention: the other shards must come out untouched.
    adapter = train_adapter(mirror, base, tmp_path, target_modules=["q_proj", "o_proj"], layers_to_transform=[1], r=8, lora_alpha=32)
    req = store_request(tmp_path, base, adapter, model_source=f"dir:{tmp_path / 'mirror'}", cache_root=cache_root)

    first = run_merge(req)
    out = _export_dir(req)
    modified = {f["path"] for f in first.files if f["modified"]}
    assert modified and len(modified) < len(shards)
    for name in shards:
        with open(mirror / name, "rb") as a, open(out / name, "rb") as b:
            n = int.from_bytes(a.read(8), "little")
            assert b.read(8 + n) == (n.to_bytes(8, "little") + a.read(n))  # same header: order and offsets
        assert (_sha(out / name) == _sha(mirror / name)) is (name not in modified)
    for p in mirror.iterdir():
        if not p.name.startswith(("model-", ".")):
            assert _sha(out / p.name) == _sha(p), p.name
    merged = _merged_tensors(out)
    for name, tensor in _expected(mirror, adapter).items():
        assert torch.equal(merged[name], tensor), name

    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    second = run_merge(req)
    assert second.files == first.files and second.manifest == first.manifest
    assert all(p.stat().st_mtime_ns >= stamp[p.name] for p in out.iterdir())
    assert {p.name for p in out.iterdir()} == {f["path"] for f in first.files}


@pytest.mark.parametrize("chunk_bytes", [4096, 4608, 200])
def test_small_row_buffers_give_the_same_shard(tmp_path, qwen7b, qwen7b_adapter, model_cache, chunk_bytes):
    # 4096 bytes hold 16 rows of a 128-wide weight, so every weight is merged in several reads;
    # 4608 hold 18, leaving short blocks of 2 and 4 rows (which MKL would sum in another order);
    # 200 bytes hold less than one row, the buffer is widened for that weight only.
    base, base_dir = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    store = open_object_store(*req.store_spec)
    adapter, weights, _ = _load_adapter(req, store)
    plan = build_plan(adapter, base_dir, pinned_digests(base, parse_model_source("standin"), base_dir, model_cache))
    (job,) = plan.shards
    whole = merge_shard(job, str(base_dir / job.path), store, "x/whole", np.frombuffer(weights, np.uint8), adapter.scale)
    small = merge_shard(job, str(base_dir / job.path), store, "x/small", np.frombuffer(weights, np.uint8), adapter.scale,
                        chunk_bytes=chunk_bytes)  # fmt: skip
    assert small == {**whole, "path": job.path} and whole["modified"]
    assert store.get_bytes("x/small") == store.get_bytes("x/whole")
    with safe_open(store.root / "x" / "small", "pt") as f:
        for name, tensor in _expected(base_dir, qwen7b_adapter).items():
            assert torch.equal(f.get_tensor(name), tensor), name


def test_corrupted_base_file_is_refused_and_nothing_kept(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, standin = qwen7b
    cache_root = tmp_path / "cache"
    copy = cache_root / "standins" / standin.name
    shutil.copytree(standin, copy)
    shard = copy / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x40  # in the last tensor's bytes: the header still parses
    shard.write_bytes(bytes(data))
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=cache_root)
    assert failed_code(req) == "merge_base_digest"
    assert list(open_object_store(*req.store_spec).list("exports/")) == []


def test_readback_mismatch_deletes_the_export(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, _ = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    plain = open_object_store(*req.store_spec)
    corrupting = CorruptingStore(plain.root, plain.url)
    assert failed_code(req, corrupting) == "merge_readback_mismatch"
    assert list(plain.list("exports/")) == []
    assert plain.exists("adapters/a1/adapter_config.json")


def test_a_shard_worker_lost_interrupts_the_merge_and_leaves_nothing(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    """A shard task's process dies (Ray: WorkerCrashedError). That is the merge interrupted, queued
    again by merge/worker.py, not failed: CI saw a dying service's merge recorded as failed with
    NodeDiedError, its node gone before its controller's thread."""
    base, _ = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    plain = open_object_store(*req.store_spec)
    assert failed_code(req, DyingStore(plain.root, plain.url)) == "merge_interrupted"
    assert list(plain.list("exports/")) == []
    assert run_merge(req, plain).files  # the same request, on a worker that lives, merges


def test_deadline_stops_the_merge(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, _ = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache, deadline_s=1e-6)
    assert failed_code(req) == "merge_timeout"
    assert list(open_object_store(*req.store_spec).list("exports/")) == []


def test_a_stop_cancels_no_shard_task_that_ends_within_the_grace():
    """`ray.cancel` on a task whose result is arriving aborts Ray 2.60's owner process (merge/run.py
    `_cancel`): tasks that end by themselves are left to end, their results intact."""
    import ray

    from merge.run import _cancel

    @ray.remote(num_cpus=0, max_retries=0)
    def quick(i: int) -> int:
        return i

    refs = [quick.remote(i) for i in range(2)]
    _cancel(refs)  # straight after submission, as a deadline that has passed does
    assert ray.get(refs) == [0, 1]  # a cancelled one would raise TaskCancelledError


def test_base_side_refusals(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, standin = qwen7b
    # An adapted module the base does not have.
    t = qwen7b_adapter.tensors()
    t = {k.replace("layers.1.", "layers.7."): v for k, v in t.items()}
    renamed = qwen7b_adapter.with_tensors(t).with_config(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    req = store_request(tmp_path / "a", base, renamed, model_source="standin", cache_root=model_cache)
    assert failed_code(req) == "merge_base_tensor_missing"
    # An fp32 base: its adapted weights are not BF16.
    cache_root = tmp_path / "cache"
    sharded_mirror(standin, base, tmp_path / "mirror", cache_root, dtype=torch.float32)
    req = store_request(tmp_path / "b", base, qwen7b_adapter, model_source=f"dir:{tmp_path / 'mirror'}", cache_root=cache_root)
    assert failed_code(req) == "merge_base_dtype"
    # A real base with no pinned digests at all.
    (cache_root / "pinned" / f"{base.id}@{base.revision}.json").unlink()
    assert failed_code(req) == "merge_base_digest"


def test_unreviewed_licence_text_in_the_base_is_refused(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, standin = qwen7b
    cache_root = tmp_path / "cache"
    copy = cache_root / "standins" / standin.name
    shutil.copytree(standin, copy)
    (copy / "LICENSE").write_text("Do what you like.\n")
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["files"]["LICENSE"] = _sha(copy / "LICENSE")
    (copy / MANIFEST).write_text(json.dumps(manifest))
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=cache_root)
    assert failed_code(req) == "merge_licence_digest"


def test_llama_export_carries_use_policy_and_meta_attribution(tmp_path, model_cache):
    base = get_base("llama-3.1-8b-instruct")
    standin = standin_dir(base, model_cache)
    adapter = train_adapter(standin, base, tmp_path, target_modules=["v_proj"])
    req = store_request(tmp_path, base, adapter, model_source="standin", cache_root=model_cache)
    result = run_merge(req)
    out = _export_dir(req)
    notice = (out / "NOTICE").read_text()
    assert ("Llama 3.1 is licensed under the Llama 3.1 Community License, Copyright © Meta Platforms, Inc. "
            "All Rights Reserved.") in notice  # fmt: skip
    assert "Built with Llama" in notice
    assert "https://www.llama.com/llama3_1/use-policy/" in (out / "USE_POLICY.md").read_text()
    assert result.manifest["added"] == ["LICENSE", "USE_POLICY.md", "NOTICE", "gridline_merge.json"]
