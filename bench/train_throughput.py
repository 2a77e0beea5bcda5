"""Supervised training throughput: our recipe (train/sft.py) against TRL's `SFTTrainer`, twice: with
its defaults, and tuned as TRL's own docs recommend for speed.

Same stand-in base, same LoRA settings, same chat rows (a realistic spread of answer lengths),
same batch size and number of steps, one epoch each, in one process, one after the other.
The figure is trained tokens per second: the real (non-pad) tokens of the rows each step trained
on, over the wall time of the training call. Ours is timed around the whole `train_sft` call
(model load and checkpoint writes included); TRL's around `trainer.train()` only, so the ratios are
conservative.

TRL's defaults moved between versions (1.x turned gradient checkpointing on by default; on this
CPU its defaults fell from 830 to 224 tokens/s between two versions), so a ratio against them
says more about TRL's release than about our recipe. The tuned baseline (`trl_sft_config`,
`tuned=True`) follows TRL's speed advice: gradient checkpointing off (memory allows at these
lengths), `padding_free` (rows flattened into one sequence, no pad tokens computed), Liger's
kernels where installed and on CUDA, bf16 on CUDA. bench/gpu_check.py runs the same tuned
baseline on the 7B shape. The last line printed is one JSON object with the figures, `ratio`
(against the defaults) and `ratio_vs_tuned`.

    .venv/bin/python -m bench.train_throughput [--rows 512] [--batch-size 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from catalog.bases import get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from openft.demo_data import LABELS, OPENERS
from pipelines.tokenize import tokenize_lines
from storage.objects import open_object_store
from train.config import TrainJob
from train.lora import TARGET_MODULES
from train.progress import FileReporter

BASE_ID = "qwen2.5-0.5b-instruct"
PHRASES = [body for bodies in LABELS.values() for body in bodies]


def chat_rows(n: int, seed: int = 0, log2_words: tuple[float, float] = (1, 8.5)) -> list[dict]:
    """Support conversations whose answers run from a few words to a few hundred (log-uniform over
    `log2_words`: 2 .. ~360 words by default)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question = f"{rng.choice(OPENERS)} {rng.choice(PHRASES)}".strip()
        words = int(2 ** rng.uniform(*log2_words))
        answer = " ".join(rng.choice(PHRASES).split()[rng.randrange(3)] for _ in range(words))
        rows.append({"messages": [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]})
    return rows


def job_for(store, cache_root: str, batch_size: int, method_type: str = "supervised", **kw) -> TrainJob:
    return TrainJob(
        job_id="ftjob-bench", run_name="bench", base_id=BASE_ID, method_type=method_type, adapter="lora", n_epochs=1,
        batch_size=batch_size, learning_rate=kw.pop("learning_rate", 2e-4), lora_rank=16, lora_alpha=32, max_seq_length=1024,
        beta=kw.pop("beta", None), seed=0, model_source="standin", cache_root=cache_root, store_spec=store.spec(),
        train_prefix="t/", eval_prefix=None, eval_source="holdout", output_prefix="out/", checkpoint_prefix="ck/", resume=False,
    )


def peft_config(base_id: str = BASE_ID):
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGET_MODULES[get_base(base_id).family], task_type="CAUSAL_LM")


def bench_args(default_rows: int) -> tuple[argparse.Namespace, int]:
    """The command line shared by both benches, and the steps of one epoch."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=default_rows)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the same for both sides; one thread is steadiest on a shared machine
    return args, -(-args.rows // args.batch_size)


def main() -> None:
    args, steps = bench_args(512)
    rows = chat_rows(args.rows)
    base = get_base(BASE_ID)
    with tempfile.TemporaryDirectory() as tmp:
        cache_root = str(Path(tmp) / "cache")
        tokenizer = load_tokenizer(base, ModelSource("standin"), Path(cache_root))
        lines = [json.dumps(r).encode() for r in rows]
        table, report = tokenize_lines(lines, 1, tokenizer, base, 1024, "supervised")
        tokens = report["tokens"]

        from train.sft import train_sft

        store = open_object_store(f"file://{tmp}/objects")
        started = time.perf_counter()
        outcome = train_sft(job_for(store, cache_root, args.batch_size), FileReporter(Path(tmp) / "log.jsonl"), table.to_pylist(), [])
        ours_s = time.perf_counter() - started
        assert outcome.status == "succeeded" and outcome.result["steps"] == steps

        model = load_model(base, ModelSource("standin"), Path(cache_root))
        trl_s, trl_lengths, _ = run_trl(rows, model, tokenizer, args.batch_size, steps, f"{tmp}/trl", tuned=False)
        model = load_model(base, ModelSource("standin"), Path(cache_root))
        tuned_s, tuned_lengths, tuned = run_trl(rows, model, tokenizer, args.batch_size, steps, f"{tmp}/trl-tuned", tuned=True)

    trl_tokens, tuned_tokens = sum(trl_lengths), sum(tuned_lengths)
    figures = {
        "bench": "sft",
        "base": BASE_ID,
        "rows": args.rows,
        "batch_size": args.batch_size,
        "steps": steps,
        "threads": args.threads,
        "ours_tokens": tokens,
        "ours_seconds": round(ours_s, 2),
        "ours_tokens_per_second": round(tokens / ours_s, 1),
        "trl_tokens": trl_tokens,
        "trl_seconds": round(trl_s, 2),
        "trl_tokens_per_second": round(trl_tokens / trl_s, 1),
        "trl_tuned_tokens": tuned_tokens,
        "trl_tuned_seconds": round(tuned_s, 2),
        "trl_tuned_tokens_per_second": round(tuned_tokens / tuned_s, 1),
        "trl_tuned_settings": tuned,
    }
    figures["ratio"] = round(figures["ours_tokens_per_second"] / figures["trl_tokens_per_second"], 2)
    figures["ratio_vs_tuned"] = round(figures["ours_tokens_per_second"] / figures["trl_tuned_tokens_per_second"], 2)
    print(json.dumps(figures))


def trl_sft_config(output_dir: str, batch_size: int, steps: int, *, tuned: bool, max_length: int = 1024, liger: bool = True):
    """TRL's `SFTConfig` for the baseline: its defaults, or tuned for speed as TRL's docs advise
    (see the module docstring). Returns (config, the tuned settings actually applied)."""
    import torch
    from trl import SFTConfig

    cuda = torch.cuda.is_available()
    common = dict(
        output_dir=output_dir, per_device_train_batch_size=batch_size, max_steps=steps, learning_rate=2e-4,
        report_to="none", save_strategy="no", logging_steps=10**6, use_cpu=not cuda, seed=0, max_length=max_length,
    )  # fmt: skip
    if not tuned:
        return SFTConfig(**common), {}
    # TRL refuses `max_length` with padding_free unless it packs; the rows here are shorter than
    # max_length already (ours drops longer ones), so nothing is left to truncate.
    settings = {"gradient_checkpointing": False, "padding_free": True, "max_length": None, "bf16": cuda,
                "use_liger_kernel": liger and cuda and _liger_installed()}  # fmt: skip
    return SFTConfig(**{**common, **settings}), settings


def _liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


def run_trl(rows: list[dict], model, tokenizer, batch_size: int, steps: int, output_dir: str, *, tuned: bool,
            max_length: int = 1024, base_id: str = BASE_ID, liger: bool = True) -> tuple[float, list[int], dict]:  # fmt: skip
    """TRL's `SFTTrainer` for `steps` steps of one epoch over `rows` (steps x batch_size of them)
    with a fresh rank-16 adapter on `model`: (seconds of `trainer.train()`, the real tokens of the
    rows' lengths in tokens as TRL tokenized them, the tuned settings applied)."""
    from datasets import Dataset
    from trl import SFTTrainer

    config, settings = trl_sft_config(output_dir, batch_size, steps, tuned=tuned, max_length=max_length, liger=liger)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=peft_config(base_id))  # fmt: skip
    lengths = [len(ids) for ids in trainer.train_dataset["input_ids"]]  # one epoch: every row once
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started, lengths, settings


if __name__ == "__main__":
    main()
