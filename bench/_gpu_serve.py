"""The GPU check's stages after training: the merge, the batch engines, the serving-parity check.

All three read what the `sft` stage trained (its adapter under `sft/out/` in the check's store)
on the generated 7B-shaped base (bench/_gpu_train.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from bench._gpu_common import BASE_ID, Ctx, gb_s, part_peak_gib, reset_peak, skipped

ADAPTERS = 4


def _ray_settings(ctx: Ctx, name: str):
    """The service's Ray start-up settings; its environment (token auth) is prepared here, before
    anything imports ray, which reads it once."""
    from entrypoints.ray_runtime import prepare_ray_environment
    from openft.settings import Settings

    settings = Settings(data_dir=ctx.work / f"ray-{name}")
    prepare_ray_environment(settings)
    return settings


def _copy_with_fsync(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())


def stage_merge(ctx: Ctx) -> dict:
    """`run_merge` of the SFT adapter into the base on this machine's disk (Ray shard tasks on
    every CPU), against a plain copy of the same shards (with fsync, as the merge's writes)."""
    if (why := ctx.ready("ray")) is not None:
        raise RuntimeError(why)
    settings = _ray_settings(ctx, "merge")
    import ray

    from entrypoints.ray_runtime import start_ray
    from catalog.bases import get_base
    from merge.run import MergeRequest, run_merge
    from storage.objects import open_object_store

    base = get_base(BASE_ID)
    mirror = ctx.mirror_root / base.hf_repo
    shards = sorted(mirror.glob("*.safetensors"))
    weights = sum(p.stat().st_size for p in shards)
    copy_dir = ctx.work / "plain-copy"
    copy_dir.mkdir(exist_ok=True)
    started = time.monotonic()
    for shard in shards:
        _copy_with_fsync(shard, copy_dir / shard.name)
    copy_s = time.monotonic() - started
    shutil.rmtree(copy_dir)

    start_ray(settings, dashboard=False, num_cpus=os.cpu_count())
    try:
        store = open_object_store(ctx.store_url)
        req = MergeRequest(BASE_ID, ctx.model_source, str(ctx.cache_root), store.spec(), "sft/out", "exports/gpu-check")
        started = time.monotonic()
        result = run_merge(req)
        merge_s = time.monotonic() - started
        store.delete_prefix("exports/gpu-check/")  # the disk holds the base, this and the parity merge otherwise
    finally:
        ray.shutdown()
    return {"figures": {
        "weights_bytes": weights, "shards": len(shards), "cpus": os.cpu_count(), "files": len(result.files),
        "merge_s": round(merge_s, 2), "merge_gb_s": gb_s(weights, merge_s),
        "copy_s": round(copy_s, 2), "copy_gb_s": gb_s(weights, copy_s),
        "ratio_to_copy": round(copy_s / merge_s, 3),
        "note": "the base's shards were just written and hashed, so both read from the page cache",
    }}  # fmt: skip


def _adapters(ctx: Ctx) -> dict[str, dict[str, bytes]]:
    """Four adapters in the SFT adapter's exact format (keys, shapes, config), random weights."""
    import torch
    from safetensors.torch import load, save

    from storage.keys import ADAPTER_FILES
    from storage.objects import open_object_store

    store = open_object_store(ctx.store_url)
    files = {name: store.get_bytes(f"sft/out/{name}") for name in ADAPTER_FILES}
    trained = load(files["adapter_model.safetensors"])
    out = {}
    for i in range(ADAPTERS):
        gen = torch.Generator().manual_seed(i + 1)
        weights = {k: (torch.randn(v.shape, generator=gen) * 0.01).to(v.dtype) for k, v in trained.items()}
        out[f"ft-{i}"] = {**files, "adapter_model.safetensors": save(weights, metadata={"format": "pt"})}
    return out


def _requests(ctx: Ctx, tokenizer, base, names: list[str]):
    from bench.train_throughput import chat_rows
    from pipelines.generate import GenRequest, SamplingParams, render_prompt

    size = ctx.size
    rows = chat_rows(size["batch_rows_per_adapter"], seed=11)
    requests = []
    for name in names:
        for row in rows:
            ids = render_prompt(row["messages"][:-1], tokenizer, base)
            requests.append(GenRequest(len(requests), name, tuple(ids), SamplingParams(size["batch_max_tokens"], temperature=0)))
    return requests


def stage_batch(ctx: Ctx) -> dict:
    """The batch engines, generated tokens per second: all rows of the 4 adapters in one call
    (multi-LoRA) against one call per adapter, on our transformers engine and on vLLM."""
    import torch

    from catalog.bases import get_base
    from catalog.model_source import load_tokenizer, parse_model_source
    from pipelines.generate import load_engine

    base = get_base(BASE_ID)
    tokenizer = load_tokenizer(base, parse_model_source(ctx.model_source), ctx.cache_root)
    adapters = _adapters(ctx)
    requests = _requests(ctx, tokenizer, base, sorted(adapters))
    size = ctx.size
    reset_peak()
    engine = load_engine(base, model_source=ctx.model_source, cache_root=str(ctx.cache_root), adapters=adapters,
                         max_batch_rows=size["batch_max_rows"])  # fmt: skip
    engine.generate(requests[:2])  # warm-up
    ours, tokens = _timed_ways(engine.generate, requests, sorted(adapters))
    ours["peak_gib"] = part_peak_gib()
    del engine
    reset_peak()  # frees the engine's cached GPU memory: vLLM's process sizes its KV cache from what is free
    parts = {"transformers": {"status": "ok"}}
    figures = {"adapters": ADAPTERS, "rows": len(requests), "max_tokens": size["batch_max_tokens"],
               "max_batch_rows": size["batch_max_rows"], "transformers": ours}  # fmt: skip
    vllm_python = ctx.figures("install").get("vllm_python")
    if not torch.cuda.is_available():
        parts["vllm"] = skipped("no CUDA")
    elif not vllm_python:
        parts["vllm"] = skipped("no vLLM venv (see the install stage's vllm_venv part)")
    else:
        figures["vllm"] = _run_vllm(ctx, vllm_python, adapters, requests, tokens)
        parts["vllm"] = {"status": "ok"}
        figures["vllm_multi_vs_transformers_multi"] = round(figures["vllm"]["multi_tok_s"] / ours["multi_tok_s"], 3)
    return {"figures": figures, "parts": parts}


def _timed_ways(generate, requests, names: list[str]) -> tuple[dict, dict]:
    """(figures, each row's tokens of the multi-LoRA call)."""
    started = time.monotonic()
    multi = generate(requests)
    multi_s = time.monotonic() - started
    started = time.monotonic()
    sequential = [r for name in names for r in generate([q for q in requests if q.adapter == name])]
    sequential_s = time.monotonic() - started
    tokens = sum(r.completion_tokens for r in multi)
    seq_tokens = sum(r.completion_tokens for r in sequential)
    return {"generated_tokens": tokens, "multi_tok_s": round(tokens / multi_s, 1),
            "per_adapter_tok_s": round(seq_tokens / sequential_s, 1),
            "multi_vs_per_adapter": round((tokens / multi_s) / (seq_tokens / sequential_s), 3)}, {r.key: list(r.token_ids) for r in multi}  # fmt: skip


def _run_vllm(ctx: Ctx, python: str, adapters, requests, reference: dict) -> dict:
    """bench/_vllm_batch.py in vLLM's own venv, on the same adapters and prompts."""
    root = ctx.work / "vllm"
    root.mkdir(exist_ok=True)
    dirs = {}
    for name, files in adapters.items():
        (root / name).mkdir(exist_ok=True)
        for filename, data in files.items():
            (root / name / filename).write_bytes(data)
        dirs[name] = str(root / name)
    spec = {"base": BASE_ID, "model_source": ctx.model_source, "cache_root": str(ctx.cache_root), "adapters": dirs,
            "max_batch_rows": ctx.size["batch_max_rows"],
            "requests": [{"key": r.key, "adapter": r.adapter, "prompt_ids": list(r.prompt_ids),
                          "max_tokens": r.params.max_tokens} for r in requests]}  # fmt: skip
    (root / "spec.json").write_text(json.dumps(spec))
    left = max(30.0, ctx.timeout_s - 60)
    subprocess.run([python, str(ctx.repo / "bench" / "_vllm_batch.py"), str(root / "spec.json"), str(root / "out.json")],
                   check=True, timeout=left, cwd=ctx.repo)  # fmt: skip
    out = json.loads((root / "out.json").read_text())
    same = sum(out["tokens"].get(str(k)) == v for k, v in reference.items())
    return {**{k: v for k, v in out.items() if k != "tokens"}, "rows_token_identical_to_transformers": same}


def stage_parity(ctx: Ctx) -> dict:
    """train/parity.py's check of the SFT adapter in bf16 (fp32 on CPU): how far the merged and the
    served paths are from the training-time model, against docs/batches.md's GPU tolerance (0.5)."""
    from bench.train_throughput import chat_rows
    from storage.objects import open_object_store
    from train.parity import ParityRequest, run_parity

    size = ctx.size
    store = open_object_store(ctx.store_url)
    rows = chat_rows(size["parity_prompts"], seed=21)
    store.put_bytes("files/parity.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    req = ParityRequest(
        job_id="ftjob-gpu-check", base_id=BASE_ID, model_source=ctx.model_source, cache_root=str(ctx.cache_root),
        store_spec=store.spec(), adapter_prefix="sft/out/", lora_rank=16, lora_alpha=32, method_type="supervised",
        max_seq_length=size["max_seq_length"], prompts_key="files/parity.jsonl", holdout_seed=None,
        prompts=size["parity_prompts"], max_tokens=size["parity_max_tokens"], tolerance=size["parity_tolerance"],
    )  # fmt: skip
    reset_peak()
    parity = run_parity(req)["parity"]
    gap = parity["max_logit_gap"]
    paths_agree = all(p["agree"] for p in parity["paths"].values())
    return {"figures": {
        **parity, "peak_gib": part_peak_gib(),
        # At or under the tolerance every path agreed, so each smaller tolerance holds exactly when the largest gap does.
        "agrees_within": {str(t): paths_agree and gap <= t for t in (0.05, 0.1, 0.25, 0.5)},
        "note": "random weights never choose the end-of-turn token, so check = parity_end_of_turn is expected; "
                "the agreement figures are the point",
    }}  # fmt: skip
