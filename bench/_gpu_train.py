"""The GPU check's training stages: the 7B-shaped base, SFT LoRA (ours against TRL tuned), long
context, QLoRA, DPO, and the reinforcement (RFT) step once its recipe lands.

The base: Qwen2.5-7B-Instruct's real config (hidden 3584, 28 layers, 28 query / 4 key-value
heads, vocabulary 152,064, untied head) with random bf16 weights, since no hub is reachable,
saved as sharded safetensors in a `dir:` model source (catalog/model_source.py) under the base's
pinned revision, with the qwen2.5 stand-in tokenizer. Every stage loads it the way a job does.
The smoke builds the same config scaled down to the stand-in's dimensions and vocabulary.

Throughput is our recipe's own figure: the loop's last metrics report (train/loop.py), real
(non-pad) tokens over the time from the first step to the last (model load, evals and the
checkpoint write excluded); TRL's is the rows' tokens over `trainer.train()`. MFU uses
`FLOPS_FORMULA` for both, over the machine's peak (`base` measures it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench._gpu_common import BASE_ID, Ctx, Skip, cuda_reason, gb_s, part_peak_gib, reset_peak, skipped

REAL_CONFIG = dict(  # Qwen/Qwen2.5-7B-Instruct's config.json, the fields that shape compute and memory
    hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
    vocab_size=152064, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
    hidden_act="silu", use_sliding_window=False, attention_dropout=0.0, initializer_range=0.02,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)  # fmt: skip
DATASHEET_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A6000": 154.8e12}
RANK, ALPHA = 16, 32
FLOPS_FORMULA = (
    "per trained row of s tokens: s*(4*N + 6*N_lora) + 12*L*d_attn*s^2, where N counts the matmul weights (attention, "
    "MLP and the LM head, not the embeddings), N_lora the adapter's, L the layers and d_attn = heads*head_dim; 4*N is "
    "the forward (2N) and the input gradients through the frozen weights (2N), which get no weight gradients; the "
    "attention scores are counted in full (PaLM's convention, not halved for the causal mask); recomputation under "
    "gradient checkpointing is not counted. MFU = those FLOPs per second over the peak."
)


def model_config(ctx: Ctx, vocab: int) -> dict:
    if not ctx.tiny:
        return dict(REAL_CONFIG)
    from catalog.standins import _DIMS  # the stand-in's dimensions: the smoke's scale

    return {**REAL_CONFIG, **_DIMS, "vocab_size": -(-vocab // 64) * 64}


def _widths(cfg: dict) -> tuple[int, int, int, int, int]:
    """(hidden, layers, intermediate, query width, key-value width) of a Qwen2 config."""
    d = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    return d, cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim


def lora_params(cfg: dict, rank: int = RANK) -> int:
    """The adapter's weights: A (r x in) and B (out x r) on all seven projections of every layer."""
    d, layers, inter, q, kv = _widths(cfg)
    return layers * rank * ((d + q) + 2 * (d + kv) + (q + d) + 3 * (d + inter))


def train_flops(lengths: list[int], cfg: dict, rank: int = RANK) -> float:
    d, layers, inter, q, kv = _widths(cfg)
    n = layers * (d * q + 2 * d * kv + q * d + 3 * d * inter) + d * cfg["vocab_size"]
    return (4 * n + 6 * lora_params(cfg, rank)) * sum(lengths) + 12 * layers * q * sum(s * s for s in lengths)


def _matmul_peak(cuda: bool) -> float:
    """FLOP/s of a large matrix product here (bf16 on CUDA, fp32 on CPU): the measured ceiling."""
    import torch

    n, reps = (8192, 10) if cuda else (512, 3)
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(2):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(reps):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - started)


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def stage_base(ctx: Ctx) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from catalog.bases import get_base
    from catalog.model_source import REVISION_MARKER
    from catalog.standins import build_tokenizer
    from merge.plan import pinned_path

    base = get_base(BASE_ID)
    mirror = ctx.mirror_root / base.hf_repo
    mirror.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(base)
    tokenizer.save_pretrained(mirror)
    cfg = model_config(ctx, len(tokenizer))
    config = Qwen2Config(**cfg, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    config.architectures = ["Qwen2ForCausalLM"]
    cuda = torch.cuda.is_available()
    started = time.monotonic()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    init_s = time.monotonic() - started
    started = time.monotonic()
    # The real model's four ~4 GB shards; the smoke's are small, so its merge has several too.
    model.save_pretrained(mirror, max_shard_size="4GB" if not ctx.tiny else "1MB")
    save_s = time.monotonic() - started
    params = sum(p.numel() for p in model.parameters())
    del model
    (mirror / REVISION_MARKER).write_text(base.revision)
    files = sorted(p for p in mirror.iterdir() if p.is_file() and p.name != REVISION_MARKER)
    with ThreadPoolExecutor(8) as pool:
        digests = dict(zip([p.name for p in files], pool.map(_sha256, files)))
    pinned = pinned_path(base, ctx.cache_root)
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_text(json.dumps({"base": base.id, "revision": base.revision, "files": digests}))
    weights = sum(p.stat().st_size for p in files if p.suffix == ".safetensors")
    name = torch.cuda.get_device_name(0) if cuda else None
    datasheet = next((v for k, v in DATASHEET_BF16.items() if name and k in name), None)
    return {"figures": {
        "base": BASE_ID, "config": {k: v for k, v in cfg.items() if k != "rope_parameters"}, "parameters": params,
        "weights_bytes": weights, "shards": sum(p.suffix == ".safetensors" for p in files), "init_s": round(init_s, 2),
        "save_s": round(save_s, 2), "save_gb_s": gb_s(weights, save_s),
        "matmul_peak_flops": _matmul_peak(cuda), "datasheet_peak_flops": datasheet, "tokenizer": "qwen2.5 stand-in",
    }}  # fmt: skip


# -- rows ---------------------------------------------------------------------------------------
def _tokenized(ctx: Ctx, rows: list[dict], max_seq: int, method: str = "supervised") -> tuple[list[dict], dict]:
    from catalog.bases import get_base
    from catalog.model_source import load_tokenizer, parse_model_source
    from pipelines.tokenize import tokenize_lines

    base = get_base(BASE_ID)
    tokenizer = load_tokenizer(base, parse_model_source(ctx.model_source), ctx.cache_root)
    table, report = tokenize_lines([json.dumps(r).encode() for r in rows], 1, tokenizer, base, max_seq, method)
    return table.to_pylist(), report


def calibrate(ctx: Ctx, median_tokens: int, spread: float, seed: int = 0) -> float:
    """log2 of the answer words (bench/train_throughput.py's chat rows, log-uniform over +-`spread`
    octaves around it) that gives rows a median of about `median_tokens`: two tokenized passes."""
    from bench.train_throughput import chat_rows

    center = 7.0
    for _ in range(2):
        sample, _ = _tokenized(ctx, chat_rows(32, seed + 99, (center - spread, center + spread)), 10**6)
        center += 0.95 * math.log2(median_tokens / statistics.median(len(r["input_ids"]) for r in sample))
    return center


def chat_rows_at(n: int, center: float, spread: float, seed: int = 0) -> list[dict]:
    from bench.train_throughput import chat_rows

    return chat_rows(n, seed, (center - spread, center + spread))


def _length_figures(lengths: list[int]) -> dict:
    q = statistics.quantiles(lengths, n=10) if len(lengths) > 1 else [lengths[0]] * 9
    return {"rows": len(lengths), "tokens": sum(lengths), "median_tokens": statistics.median(lengths),
            "p10_tokens": round(q[0]), "p90_tokens": round(q[-1]), "max_tokens": max(lengths)}  # fmt: skip


# -- our recipe ----------------------------------------------------------------------------------
def run_ours(ctx: Ctx, name: str, tokenized: list[dict], *, batch_size: int, max_seq: int, method: str = "supervised",
             adapter: str = "lora", **job_kw) -> dict:  # fmt: skip
    """One run of our recipe (train_sft / train_dpo) on the generated base; the loop's figures."""
    from bench.train_throughput import job_for
    from storage.objects import open_object_store
    from train.progress import FileReporter

    store = open_object_store(ctx.store_url)
    job = dataclasses.replace(
        job_for(store, str(ctx.cache_root), batch_size, method, **job_kw), base_id=BASE_ID, model_source=ctx.model_source,
        max_seq_length=max_seq, adapter=adapter, run_name=f"gpu-check-{name}", output_prefix=f"{name}/out/",
        checkpoint_prefix=f"{name}/ck/",
    )  # fmt: skip
    log = ctx.work / "logs" / f"{name}.train.jsonl"
    log.unlink(missing_ok=True)
    reset_peak()
    started = time.monotonic()
    if method == "dpo":
        from train.dpo import train_dpo as train
    else:
        from train.sft import train_sft as train
    outcome = train(job, FileReporter(log), tokenized, [])
    wall = time.monotonic() - started
    if outcome.status != "succeeded":
        raise RuntimeError(f"{name}: the run ended {outcome.status} ({outcome.error})")
    last = [r["data"] for r in FileReporter(log).records() if r["type"] == "metrics"][-1]
    return {"steps": outcome.result["steps"], "loop_s": round(last["elapsed"], 3), "wall_s": round(wall, 2),
            "tokens_per_second": round(last["tokens_per_second"], 1), "train_loss": outcome.result["train_loss"],
            "peak_gib": part_peak_gib(), "adapter_prefix": job.output_prefix}  # fmt: skip


def _mfu(flops: float, seconds: float, ctx: Ctx) -> dict:
    base = ctx.figures("base")
    achieved = flops / seconds
    peak = base.get("datasheet_peak_flops") or base.get("matmul_peak_flops")
    return {"achieved_flops": round(achieved), "mfu": round(achieved / peak, 4) if peak else None,
            "mfu_vs_measured_matmul": round(achieved / base["matmul_peak_flops"], 4) if base.get("matmul_peak_flops") else None}  # fmt: skip


def stage_sft(ctx: Ctx) -> dict:
    import torch

    size, cfg = ctx.size, ctx.figures("base")["config"]
    n = size["sft_steps"] * size["batch_size"]
    center = calibrate(ctx, size["median_tokens"], 1.5)
    rows = chat_rows_at(n, center, 1.5)
    tokenized, _ = _tokenized(ctx, rows, size["max_seq_length"])
    if len(tokenized) != n:
        raise RuntimeError(f"{n - len(tokenized)} rows were longer than max_seq_length")
    lengths = [len(r["input_ids"]) for r in tokenized]
    ours = run_ours(ctx, "sft", tokenized, batch_size=size["batch_size"], max_seq=size["max_seq_length"])
    ours.update(_mfu(train_flops(lengths, cfg), ours["loop_s"], ctx))

    cuda = torch.cuda.is_available()
    parts = {"bf16_autocast": {"status": "ok"} if cuda else skipped("no CUDA: the recipe trains fp32 on CPU")}
    figures = {"rows": _length_figures(lengths), "answer_log2_words": round(center, 3), "batch_size": size["batch_size"],
               "lora_rank": RANK, "ours": ours, "flops_formula": FLOPS_FORMULA, "dtype": "bfloat16" if cuda else "float32"}  # fmt: skip
    # TRL's side is a part: when it cannot run here (its packages, Liger's kernels), ours still counts.
    if (why := ctx.ready("trl")) is not None:
        parts["trl_tuned"] = skipped(why)
        return {"figures": figures, "parts": parts}
    trl, errors = None, []
    for liger in (True, False) if cuda else (False,):  # on a failure with Liger, the rest of TRL's advice without it
        try:
            trl = _trl_tuned(ctx, rows, cfg, liger=liger)
            break
        except Exception as exc:
            errors.append(f"{'with' if liger else 'without'} Liger: {type(exc).__name__}: {exc}"[:600])
    if trl is None:
        parts["trl_tuned"] = {"status": "failed", "error": "; ".join(errors)}
        return {"figures": figures, "parts": parts}
    if errors:
        parts["liger"] = {"status": "failed", "error": errors[0]}
    parts.setdefault("liger", {"status": "ok"} if trl["settings"]["use_liger_kernel"] else skipped(
        "no CUDA" if not cuda else ctx.ready("liger") or "liger-kernel is not installed"))  # fmt: skip
    parts["trl_tuned"] = {"status": "ok"}
    figures["trl_tuned"] = trl
    figures["ratio_vs_trl_tuned"] = round(ours["tokens_per_second"] / trl["tokens_per_second"], 3)
    return {"figures": figures, "parts": parts}


def _trl_tuned(ctx: Ctx, rows: list[dict], cfg: dict, *, liger: bool) -> dict:
    import torch

    from bench.train_throughput import run_trl
    from catalog.bases import get_base
    from catalog.model_source import load_model, load_tokenizer, parse_model_source

    size = ctx.size
    base, source = get_base(BASE_ID), parse_model_source(ctx.model_source)
    model = load_model(base, source, ctx.cache_root, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    reset_peak()
    seconds, lengths, settings = run_trl(rows, model, load_tokenizer(base, source, ctx.cache_root), size["batch_size"],
                                         size["sft_steps"], str(ctx.work / "trl"), tuned=True,
                                         max_length=size["max_seq_length"], base_id=BASE_ID, liger=liger)  # fmt: skip
    return {"seconds": round(seconds, 2), "tokens_per_second": round(sum(lengths) / seconds, 1), "peak_gib": part_peak_gib(),
            "settings": settings, **_length_figures(lengths), **_mfu(train_flops(lengths, cfg), seconds, ctx)}  # fmt: skip


def stage_long_context(ctx: Ctx) -> dict:
    from train.lora import LONG_CONTEXT

    size = ctx.size
    n, seq = size["long_steps"] * size["long_batch"], size["long_seq"]
    # Rows just under 8,192 tokens; the smoke's are shorter (attention on CPU), the run still above 2,048.
    rows = chat_rows_at(n, calibrate(ctx, size["long_tokens"], 0.02, seed=5), 0.02, seed=5)
    tokenized, _ = _tokenized(ctx, rows, seq)
    if not tokenized:
        raise RuntimeError("no row fit max_seq_length")
    lengths = [len(r["input_ids"]) for r in tokenized]
    ours = run_ours(ctx, "long", tokenized, batch_size=size["long_batch"], max_seq=seq)
    ours.update(_mfu(train_flops(lengths, ctx.figures("base")["config"]), ours["loop_s"], ctx))
    return {"figures": {"max_seq_length": seq, "gradient_checkpointing": seq > LONG_CONTEXT, "rows": _length_figures(lengths),
                        "batch_size": size["long_batch"], "ours": ours, "flops_formula": FLOPS_FORMULA}}  # fmt: skip


def _ratio_to_sft(ctx: Ctx, tokens_per_second: float) -> float:
    return round(tokens_per_second / ctx.figures("sft")["ours"]["tokens_per_second"], 3)


def stage_qlora(ctx: Ctx) -> dict:
    if (why := cuda_reason() or ctx.ready("qlora")) is not None:
        raise Skip(why)
    size = ctx.size
    n = size["qlora_steps"] * size["batch_size"]
    rows = chat_rows_at(n, ctx.figures("sft")["answer_log2_words"], 1.5)
    tokenized, _ = _tokenized(ctx, rows, size["max_seq_length"])
    ours = run_ours(ctx, "qlora", tokenized, batch_size=size["batch_size"], max_seq=size["max_seq_length"], adapter="qlora")
    return {"figures": {"quantization": "nf4, double quant, bf16 compute", "rows": _length_figures([len(r["input_ids"]) for r in tokenized]),
                        "ours": ours, "ratio_to_sft_lora": _ratio_to_sft(ctx, ours["tokens_per_second"])}}  # fmt: skip


def stage_dpo(ctx: Ctx) -> dict:
    from bench.dpo_throughput import preference_rows

    size = ctx.size
    n = size["dpo_steps"] * size["dpo_batch"]
    center = ctx.figures("sft")["answer_log2_words"]  # answers of SFT's lengths
    rows = preference_rows(n, 0, (center - 1.5, center + 1.5))
    tokenized, report = _tokenized(ctx, rows, size["max_seq_length"], "dpo")
    ours = run_ours(ctx, "dpo", tokenized, batch_size=size["dpo_batch"], max_seq=size["max_seq_length"], method="dpo",
                    beta=0.1, learning_rate=5e-6)  # fmt: skip
    return {"figures": {
        "beta": 0.1, "pairs": len(tokenized), "batch_size": size["dpo_batch"], "ours": ours,
        "tokens_counted": "each pair's prompt twice and both answers (the sequences a step runs)",
        "ratio_to_sft_lora": _ratio_to_sft(ctx, ours["tokens_per_second"]),
    }}  # fmt: skip


def stage_rft(ctx: Ctx) -> dict:
    """One reinforcement step on the 7B shape: `train.rft.train_rft(job, reporter, train_rows,
    eval_rows)` on `train.rft.example_rows` (the ticket prompts, a string-check grader) with
    `train.rft.example_settings`; completions/s and seconds per step from its metrics
    (`completions_per_second`, `elapsed` / `step`)."""
    # On CPU the stand-in's step says nothing about the GPU day; tests/train/test_rft.py runs it there.
    if (why := cuda_reason()) is not None:
        raise Skip(why)
    import train.rft as rft
    from bench.train_throughput import job_for
    from storage.objects import open_object_store
    from train.progress import FileReporter

    size = ctx.size
    job = dataclasses.replace(
        job_for(open_object_store(ctx.store_url), str(ctx.cache_root), size["batch_size"]),
        method_type=rft.METHOD_TYPE, reinforcement=rft.example_settings(max_completion_tokens=64), beta=0.04,
        base_id=BASE_ID, model_source=ctx.model_source, max_seq_length=size["max_seq_length"], run_name="gpu-check-rft",
        output_prefix="rft/out/", checkpoint_prefix="rft/ck/",
    )  # fmt: skip
    log = ctx.work / "logs" / "rft.train.jsonl"
    reset_peak()
    rows = rft.example_rows(size["batch_size"], str(ctx.cache_root), BASE_ID, ctx.model_source)
    outcome = rft.train_rft(job, FileReporter(log), rows, [])
    last = [r["data"] for r in FileReporter(log).records() if r["type"] == "metrics"][-1]
    return {"figures": {"status": outcome.status, "steps": last["step"], "seconds_per_step": round(last["elapsed"] / last["step"], 3),
                        "completions_per_second": last.get("completions_per_second"), "peak_gib": part_peak_gib()}}  # fmt: skip
