"""Supervised training throughput: our recipe (train/sft.py) against TRL's `SFTTrainer` with its defaults.

Same stand-in base, same LoRA settings, same chat rows (a realistic spread of answer lengths),
same batch size and number of steps, one epoch each, in one process, one after the other.
The figure is trained tokens per second: the real (non-pad) tokens of the rows each step trained
on, over the wall time of the training call. Ours is timed around the whole `train_sft` call
(model load and checkpoint writes included); TRL's around `trainer.train()` only, so the ratio is
conservative. The last line printed is one JSON object with the figures and `ratio`.

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


def chat_rows(n: int, seed: int = 0) -> list[dict]:
    """Support conversations whose answers run from a few words to a few hundred (log-uniform)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question = f"{rng.choice(OPENERS)} {rng.choice(PHRASES)}".strip()
        words = int(2 ** rng.uniform(1, 8.5))  # 2 .. ~360 words
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


def peft_config():
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGET_MODULES[get_base(BASE_ID).family], task_type="CAUSAL_LM")


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

        trl_s, trl_tokens = run_trl(rows, base, cache_root, args.batch_size, steps, tmp)

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
    }
    figures["ratio"] = round(figures["ours_tokens_per_second"] / figures["trl_tokens_per_second"], 2)
    print(json.dumps(figures))


def run_trl(rows: list[dict], base, cache_root: str, batch_size: int, steps: int, tmp: str) -> tuple[float, int]:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model = load_model(base, ModelSource("standin"), Path(cache_root))
    tokenizer = load_tokenizer(base, ModelSource("standin"), Path(cache_root))
    config = SFTConfig(
        output_dir=f"{tmp}/trl", per_device_train_batch_size=batch_size, max_steps=steps, learning_rate=2e-4,
        report_to="none", save_strategy="no", logging_steps=10**6, use_cpu=True, seed=0, max_length=1024,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft_config())
    tokens = sum(len(ids) for ids in trainer.train_dataset["input_ids"])  # one epoch: every row once
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started, tokens


if __name__ == "__main__":
    main()
