"""preflight: the first table's refusals and every adapter-side code, from a real peft adapter
edited into each malformed form (no weights read, no Ray)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from catalog.bases import BASES, get_base
from catalog.standins import standin_dir
from merge.errors import MergeError
from merge.export import LICENCE_DIR, REVIEWED, reviewed_licence
from merge.run import ADAPTER_MODEL, preflight
from tests.merge.builders import Adapter, store_request, train_adapter

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def _code(tmp_path, base, adapter: Adapter, model_cache, **kw) -> str:
    req = store_request(tmp_path, base, adapter, model_source="standin", cache_root=model_cache, **kw)
    with pytest.raises(MergeError) as err:
        preflight(req)
    return err.value.code


def _tensors(adapter: Adapter, edit) -> Adapter:
    tensors = adapter.tensors()
    edit(tensors)
    return adapter.with_tensors(tensors)


def test_valid_adapter_passes(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, _ = qwen7b
    preflight(store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache))


MALFORMED = {
    "merge_adapter_dtype": lambda a: _tensors(a, lambda t: t.update({Q_A: t[Q_A].double()})),
    "merge_adapter_pair": lambda a: _tensors(a, lambda t: t.pop(Q_B)),
    "merge_adapter_shape": lambda a: _tensors(a, lambda t: t.update({Q_A: torch.zeros(5, t[Q_A].shape[1])})),
    "merge_adapter_tensor_name": lambda a: _tensors(a, lambda t: t.update({"base_model.model.model.norm.weight": torch.ones(4)})),
    "merge_adapter_header": lambda a: Adapter(a.config, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}"),
    "merge_alpha": lambda a: a.with_config(lora_alpha=300),
    "merge_rank": lambda a: a.with_config(r=65),
    "merge_scale": lambda a: Adapter(a.config.replace(b'"lora_alpha": 8', b'"lora_alpha": Infinity'), a.model),
    "merge_base_revision": lambda a: a.with_config(revision="0" * 40),
    "merge_base_unknown": lambda a: a.with_config(base_model_name_or_path="gpt2"),
}


@pytest.mark.parametrize("code", list(MALFORMED))
def test_malformed_adapter_gives_its_code(tmp_path, qwen7b, qwen7b_adapter, model_cache, code):
    base, _ = qwen7b
    assert _code(tmp_path, base, MALFORMED[code](qwen7b_adapter), model_cache) == code


@pytest.mark.parametrize(
    "changes",
    [
        {"use_dora": True},
        {"use_rslora": True},
        {"fan_in_fan_out": True},
        {"rank_pattern": {"q_proj": 8}},
        {"modules_to_save": ["score"]},
        {"peft_type": "IA3"},
        {"base_model_name_or_path": "Qwen/Qwen3-8B"},  # another catalog base
    ],
)
def test_config_not_mergeable_for_this_base(tmp_path, qwen7b, qwen7b_adapter, model_cache, changes):
    base, _ = qwen7b
    assert _code(tmp_path, base, qwen7b_adapter.with_config(**changes), model_cache) == "merge_adapter_config"


@pytest.mark.parametrize("bad", [0, "8", 2.0, True])
def test_rank_must_be_an_integer_in_range(tmp_path, qwen7b, qwen7b_adapter, model_cache, bad):
    base, _ = qwen7b
    assert _code(tmp_path, base, qwen7b_adapter.with_config(r=bad), model_cache) == "merge_rank"


@pytest.mark.parametrize("bad", [0, 0.5, "16", None])
def test_alpha_must_be_a_number_in_range(tmp_path, qwen7b, qwen7b_adapter, model_cache, bad):
    base, _ = qwen7b
    assert _code(tmp_path, base, qwen7b_adapter.with_config(lora_alpha=bad), model_cache) == "merge_alpha"


def test_unknown_base_id_and_changed_or_missing_adapter(tmp_path, qwen7b, qwen7b_adapter, model_cache):
    base, _ = qwen7b
    unknown = dataclasses.replace(base, id="gpt2")
    assert _code(tmp_path / "a", unknown, qwen7b_adapter, model_cache) == "merge_base_unknown"
    changed = {**qwen7b_adapter.sha256(), "adapter_config.json": "0" * 64}
    assert _code(tmp_path / "b", base, qwen7b_adapter, model_cache, adapter_sha256=changed) == "merge_adapter_changed"
    req = store_request(tmp_path / "c", base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    (tmp_path / "c" / "objects" / "adapters" / "a1" / ADAPTER_MODEL).unlink()
    with pytest.raises(MergeError) as err:
        preflight(req)
    assert err.value.code == "merge_adapter_unavailable"


def test_lm_head_on_a_tied_base_is_refused(tmp_path, model_cache):
    base = get_base("qwen2.5-0.5b-instruct")
    adapter = train_adapter(standin_dir(base, model_cache), base, tmp_path, target_modules=["q_proj", "lm_head"])
    assert any(".lm_head.lora_A" in k for k in adapter.tensors())
    err_code = _code(tmp_path, base, adapter, model_cache)
    assert err_code == "merge_tied_lm_head"
    assert MergeError(err_code, "").refusal


def test_licences_of_every_base_are_reviewed_and_catalog_texts_unchanged():
    reviewed = json.loads(REVIEWED.read_text())
    for base in BASES.values():
        files, _ = reviewed_licence(base)
        assert [f.name for f in files] == ["LICENSE", *base.extra_files]
    for name, entry in reviewed.items():
        for spec in entry.get("files", {}).values() if name != "_about" else ():
            digest = hashlib.sha256((LICENCE_DIR / spec["catalog_file"]).read_bytes()).hexdigest()
            assert digest in spec["sha256"]
    # The well-known digest of the Apache-2.0 text as apache.org serves it.
    assert hashlib.sha256((LICENCE_DIR / "Apache-2.0.txt").read_bytes()).hexdigest() == (
        "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
    )


def test_unreviewed_licence_is_refused():
    base = dataclasses.replace(get_base("qwen3-8b"), licence="Qwen Research License")
    with pytest.raises(MergeError) as err:
        reviewed_licence(base)
    assert err.value.code == "merge_licence_unreviewed" and err.value.refusal
