"""The failed-merge codes a base mirror, a base file changing under a running merge, or the export's
storage can cause, each reached with real files: a `dir:` mirror whose operator-pinned digests are
re-pinned after each edit (so the failure is the one under test, not `merge_base_digest`), shard
files edited between planning and the shard task, and an export directory the file system refuses
to write into. Nothing may be left under the export prefix."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from catalog.model_source import parse_model_source
from merge.errors import MergeError
from merge.plan import INDEX, build_plan, pinned_digests
from merge.run import MergeRequest, _load_adapter
from merge.shard import merge_shard
from storage.objects import open_object_store
from tests.merge.builders import failed_code, pin_digests, sharded_mirror, store_request

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _code(req: MergeRequest) -> str:
    code = failed_code(req)
    assert list(open_object_store(*req.store_spec).list("exports/")) == []
    return code


@pytest.fixture
def mirror(tmp_path, qwen7b, qwen7b_adapter):
    """(mirror dir, cache root, request): a sharded `dir:` mirror of the stand-in and a merge request on it."""
    base, standin = qwen7b
    cache_root = tmp_path / "cache"
    target = sharded_mirror(standin, base, tmp_path / "mirror", cache_root)
    req = store_request(tmp_path, base, qwen7b_adapter, model_source=f"dir:{tmp_path / 'mirror'}", cache_root=cache_root)
    return target, cache_root, req


def _rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _shard_of(mirror: Path, tensor: str) -> Path:
    return mirror / json.loads((mirror / INDEX).read_text())["weight_map"][tensor]


def test_unreadable_base_header(mirror, qwen7b):
    target, cache_root, req = mirror
    shard = _shard_of(target, "model.layers.1.self_attn.q_proj.weight")
    shard.write_bytes(struct.pack("<Q", 7) + b"{broken" + shard.read_bytes()[15:])
    pin_digests(target, qwen7b[0], cache_root)
    assert _code(req) == "merge_base_header"


def test_refused_base_file_name(mirror, qwen7b):
    target, cache_root, req = mirror
    pin_digests(target, qwen7b[0], cache_root, extra={"../outside.json": "0" * 64})
    assert _code(req) == "merge_base_path"


def test_missing_base_file(mirror, qwen7b):
    target, cache_root, req = mirror
    (target / "tokenizer_config.json").unlink()
    assert _code(req) == "merge_base_unavailable"


def test_base_weight_in_two_shards(mirror, qwen7b):
    target, cache_root, req = mirror
    index = json.loads((target / INDEX).read_text())
    name = "model.norm.weight"
    twin = torch.ones(128, dtype=torch.bfloat16)
    save_file({name: twin, "extra.weight": twin.clone()}, target / "model-extra.safetensors", metadata={"format": "pt"})
    index["weight_map"]["extra.weight"] = "model-extra.safetensors"
    (target / INDEX).write_text(json.dumps(index))
    pin_digests(target, qwen7b[0], cache_root)
    assert _code(req) == "merge_base_tensor_duplicate"


def test_two_adapted_weights_overlapping_in_a_shard(tmp_path, qwen7b, qwen7b_adapter):
    base, standin = qwen7b
    cache_root = tmp_path / "cache"
    target = sharded_mirror(standin, base, tmp_path / "mirror", cache_root, max_shard_size="100MB")
    shard = target / "model.safetensors"  # one shard: q_proj and v_proj of a layer are in the same file

    def overlap(header):
        q, v = header["model.layers.1.self_attn.q_proj.weight"], header["model.layers.1.self_attn.v_proj.weight"]
        size = v["data_offsets"][1] - v["data_offsets"][0]
        v["data_offsets"] = [q["data_offsets"][0] + 2, q["data_offsets"][0] + 2 + size]

    _rewrite_header(shard, overlap)
    pin_digests(target, base, cache_root)
    req = store_request(tmp_path, base, qwen7b_adapter, model_source=f"dir:{tmp_path / 'mirror'}", cache_root=cache_root)
    assert _code(req) == "merge_target_tensor"


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda data: data[:-1], "merge_source_short"),
        (lambda data: data + b"\0", "merge_source_long"),
        (lambda data: data.replace(b'"format":"pt"', b'"format":"PT"', 1), "merge_source_header"),
    ],
)
def test_base_shard_changed_after_planning(mirror, qwen7b, edit, code):
    # The plan reads the shards' headers; the shard task runs later. A shard that changed in between
    # is caught by the task, before anything is published.
    target, cache_root, req = mirror
    store = open_object_store(*req.store_spec)
    adapter, weights, _ = _load_adapter(req, store)
    plan = build_plan(adapter, target, pinned_digests(adapter.base, parse_model_source(req.model_source), target, cache_root))
    job = next(j for j in plan.shards if j.targets)
    shard = target / job.path
    changed = edit(shard.read_bytes())
    assert changed != shard.read_bytes()
    shard.write_bytes(changed)
    with pytest.raises(MergeError) as err:
        merge_shard(job, str(shard), store, f"exports/m1/{job.path}", np.frombuffer(weights, np.uint8), adapter.scale)
    assert err.value.code == code
    assert list(store.list("exports/")) == []


def test_refused_export_prefix(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, _ = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    for prefix in ("../outside", "/", "a//b"):
        bad = MergeRequest(**{**req.__dict__, "export_prefix": prefix})
        assert _code(bad) == "merge_weights_prefix"


def test_storage_refusing_the_export_fails_the_merge(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    # The export's directory made immutable (chattr +i): the file system refuses every new file in
    # it, even to root. An error that is none of the named ones is `merge_failed`.
    base, _ = qwen7b
    req = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    locked = open_object_store(*req.store_spec).root / "exports"
    locked.mkdir()
    subprocess.run(["chattr", "+i", str(locked)], check=True)
    try:
        assert _code(req) == "merge_failed"
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    shutil.rmtree(locked)
