"""DPO training throughput: our recipe (train/dpo.py) against TRL's `DPOTrainer` with its defaults.

Same stand-in base, LoRA settings, preference pairs (answers of a realistic spread of lengths),
batch size and steps, one epoch each, in one process. The figure is trained tokens per second,
counting each pair's prompt and both answers (the billed basis, the same count for both sides),
over the wall time of the training call: ours around the whole `train_dpo` call (model load and
the up-front reference pass included), TRL's around `trainer.train()` (its reference pass runs
per batch, with the adapter disabled, as ours). The last line printed is one JSON object.

    .venv/bin/python -m bench.dpo_throughput [--rows 256] [--batch-size 8] [--threads 1]
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train_throughput import BASE_ID, bench_args, chat_rows, job_for, peft_config
from catalog.bases import get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from pipelines.tokenize import tokenize_lines
from storage.objects import open_object_store
from train.progress import FileReporter


def preference_rows(n: int, seed: int = 0, log2_words: tuple[float, float] = (1, 8.5)) -> list[dict]:
    """Each chat row's answer as the preferred output, another row's answer as the other one."""
    rows = chat_rows(n, seed, log2_words)
    others = chat_rows(n, seed + 1, log2_words)
    random.Random(seed).shuffle(others)
    return [
        {
            "input": {"messages": r["messages"][:-1]},
            "preferred_output": [r["messages"][-1]],
            "non_preferred_output": [o["messages"][-1]],
        }
        for r, o in zip(rows, others)
    ]


def main() -> None:
    args, steps = bench_args(256)
    rows = preference_rows(args.rows)
    base = get_base(BASE_ID)
    with tempfile.TemporaryDirectory() as tmp:
        cache_root = str(Path(tmp) / "cache")
        tokenizer = load_tokenizer(base, ModelSource("standin"), Path(cache_root))
        table, report = tokenize_lines([json.dumps(r).encode() for r in rows], 1, tokenizer, base, 1024, "dpo")
        tokens = report["tokens"]

        from train.dpo import train_dpo

        store = open_object_store(f"file://{tmp}/objects")
        job = job_for(store, cache_root, args.batch_size, "dpo", beta=0.1, learning_rate=5e-6)
        started = time.perf_counter()
        outcome = train_dpo(job, FileReporter(Path(tmp) / "log.jsonl"), table.to_pylist(), [])
        ours_s = time.perf_counter() - started
        assert outcome.status == "succeeded" and outcome.result["steps"] == steps

        trl_s = run_trl(rows, base, cache_root, args.batch_size, steps, tmp)

    figures = {
        "bench": "dpo",
        "base": BASE_ID,
        "rows": args.rows,
        "batch_size": args.batch_size,
        "steps": steps,
        "threads": args.threads,
        "tokens": tokens,
        "ours_seconds": round(ours_s, 2),
        "ours_tokens_per_second": round(tokens / ours_s, 1),
        "trl_seconds": round(trl_s, 2),
        "trl_tokens_per_second": round(tokens / trl_s, 1),
    }
    figures["ratio"] = round(figures["ours_tokens_per_second"] / figures["trl_tokens_per_second"], 2)
    print(json.dumps(figures))


def run_trl(rows: list[dict], base, cache_root: str, batch_size: int, steps: int, tmp: str) -> float:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model = load_model(base, ModelSource("standin"), Path(cache_root))
    tokenizer = load_tokenizer(base, ModelSource("standin"), Path(cache_root))
    data = Dataset.from_list([
        {"prompt": r["input"]["messages"], "chosen": r["preferred_output"], "rejected": r["non_preferred_output"]} for r in rows
    ])
    config = DPOConfig(
        output_dir=f"{tmp}/trl", per_device_train_batch_size=batch_size, max_steps=steps, learning_rate=5e-6, beta=0.1,
        report_to="none", save_strategy="no", logging_steps=10**6, use_cpu=True, seed=0, max_length=1024,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer, peft_config=peft_config())
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
