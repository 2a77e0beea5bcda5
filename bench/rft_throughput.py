"""Reinforcement fine-tuning throughput: our step (train/rft.py) against TRL's `GRPOTrainer`.

Same stand-in base (qwen2.5-0.5b), LoRA (r 16, alpha 32, the same modules), prompts (the demo's
tickets), samples per prompt, completion length, temperature, reward (1 when the completion is the
ticket's label), learning rate, KL coefficient and steps, in one process, one after the other. TRL
is set to the same objective: `loss_type="dr_grpo"`, `scale_rewards="none"`, one generation per
optimizer step (`per_device_train_batch_size` = prompts x samples, `steps_per_generation=1`), beta
0.04. Both start from a fresh adapter, so both sample until `max_completion_tokens` on most prompts:
the work is the same on both sides.

Figures: completions per second and seconds per step of each, over the wall time of the training
call (ours around `train_rft`, model load included; TRL's around `trainer.train()`), and their
ratio. The last line printed is one JSON object with "ratio" (ours / TRL's completions per second).

    .venv/bin/python -m bench.rft_throughput [--prompts 8] [--samples 8] [--steps 4] [--max-tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.train_throughput import BASE_ID, job_for, peft_config
from catalog.bases import get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from openft.demo_data import SYSTEM, ticket_splits
from storage.objects import open_object_store
from train.progress import FileReporter

LEARNING_RATE, BETA, TEMPERATURE = 1e-5, 0.04, 1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # the same for both sides
    base = get_base(BASE_ID)
    n = args.prompts * args.steps
    tickets = ticket_splits()[0][:n]
    with tempfile.TemporaryDirectory() as tmp:
        cache_root = str(Path(tmp) / "cache")
        ours_s = run_ours(tickets, cache_root, args, tmp)
        trl_s = run_trl(tickets, base, cache_root, args, tmp)
    completions = args.steps * args.prompts * args.samples
    figures = {
        "bench": "rft", "base": BASE_ID, "prompts_per_step": args.prompts, "samples_per_prompt": args.samples,
        "steps": args.steps, "max_completion_tokens": args.max_tokens, "threads": args.threads,
        "completions": completions,
        "ours_seconds": round(ours_s, 2), "ours_completions_per_second": round(completions / ours_s, 2),
        "ours_seconds_per_step": round(ours_s / args.steps, 2),
        "trl_seconds": round(trl_s, 2), "trl_completions_per_second": round(completions / trl_s, 2),
        "trl_seconds_per_step": round(trl_s / args.steps, 2),
    }
    figures["ratio"] = round(figures["ours_completions_per_second"] / figures["trl_completions_per_second"], 2)
    print(json.dumps(figures))


def run_ours(tickets, cache_root: str, args, tmp: str) -> float:
    import train.rft as rft

    store = open_object_store(f"file://{tmp}/objects")
    rows = rft.example_rows(len(tickets), cache_root)
    job = dataclasses.replace(
        job_for(store, cache_root, args.prompts, learning_rate=LEARNING_RATE), method_type=rft.METHOD_TYPE, beta=BETA,
        reinforcement=rft.example_settings(samples_per_prompt=args.samples, max_completion_tokens=args.max_tokens,
                                           temperature=TEMPERATURE, eval_interval=10**6))
    started = time.perf_counter()
    outcome = rft.train_rft(job, FileReporter(Path(tmp) / "log.jsonl"), rows, [])
    seconds = time.perf_counter() - started
    assert outcome.status == "succeeded" and outcome.result["steps"] == args.steps, outcome
    return seconds


def run_trl(tickets, base, cache_root: str, args, tmp: str) -> float:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = load_model(base, ModelSource("standin"), Path(cache_root))
    tokenizer = load_tokenizer(base, ModelSource("standin"), Path(cache_root))
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                               "answer": label} for t, label in tickets])

    def label_reward(completions, answer, **_):
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    config = GRPOConfig(
        output_dir=f"{tmp}/trl", per_device_train_batch_size=args.prompts * args.samples, num_generations=args.samples,
        steps_per_generation=1, gradient_accumulation_steps=1, max_steps=args.steps, max_completion_length=args.max_tokens,
        learning_rate=LEARNING_RATE, beta=BETA, temperature=TEMPERATURE, loss_type="dr_grpo", scale_rewards="none",
        report_to="none", save_strategy="no", logging_steps=10**6, use_cpu=True, seed=0, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=label_reward, args=config, train_dataset=data,
                          processing_class=tokenizer, peft_config=peft_config())
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
