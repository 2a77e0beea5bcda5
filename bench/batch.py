"""Batch generation throughput: the pipeline's multi-LoRA engine against two slower ways of
generating the same rows, on the qwen2.5-0.5b stand-in with 4 random adapters, in one process.

  (a) multi-LoRA: one `load_engine` with all 4 adapters, every row in one `generate` call (rows
      of different adapters decode together; finished rows refilled);
  (b) sequential: the same engine, one `generate` call per adapter;
  (c) naive: plain transformers `generate`, one row at a time, on a peft model with the 4
      adapters (`set_adapter` per row).
All greedy with the same prompts and max_tokens; the figure is generated tokens per second over
the wall time of each way's generation (model loading excluded for all three). The tokens of (a)
are checked against (c). The last line printed is one JSON object with the figures,
`ratio_vs_sequential` and `ratio_vs_naive`.

    .venv/bin/python -m bench.batch [--rows-per-adapter 16] [--max-tokens 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from catalog.bases import get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from openft.demo_data import SYSTEM, ticket_splits
from pipelines.engine import GenRequest, SamplingParams, end_of_turn_ids
from pipelines.generate import load_engine, render_prompt
from train.lora import TARGET_MODULES, adapter_files

BASE_ID = "qwen2.5-0.5b-instruct"
ADAPTERS = 4


def random_adapter(base, cache_root: Path, seed: int, rank: int = 16) -> dict[str, bytes]:
    from peft import LoraConfig, get_peft_model

    model = load_model(base, ModelSource("standin"), cache_root)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGET_MODULES[base.family], init_lora_weights=False,
                        task_type="CAUSAL_LM")  # fmt: skip
    return adapter_files(get_peft_model(model, config), base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-adapter", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch-rows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = get_base(BASE_ID)
    cache_root = Path(tempfile.mkdtemp(prefix="openft-bench-batch-"))
    tokenizer = load_tokenizer(base, ModelSource("standin"), cache_root)
    adapters = {f"ft-{i}": random_adapter(base, cache_root, seed=i + 1) for i in range(ADAPTERS)}
    tickets = [t for t, _ in ticket_splits()[0]][: args.rows_per_adapter]
    requests = []
    for i, name in enumerate(adapters):
        for ticket in tickets:
            ids = render_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}], tokenizer, base)
            requests.append(GenRequest(len(requests), name, tuple(ids), SamplingParams(args.max_tokens, temperature=0)))

    engine = load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters, max_batch_rows=args.max_batch_rows)
    engine.generate(requests[:2])  # warm-up
    start = time.perf_counter()
    multi = engine.generate(requests)
    multi_s = time.perf_counter() - start

    start = time.perf_counter()
    sequential = []
    for name in adapters:
        sequential += engine.generate([r for r in requests if r.adapter == name])
    sequential_s = time.perf_counter() - start

    naive_model = naive_peft_model(base, cache_root, adapters)
    eot = list(end_of_turn_ids(tokenizer, base))
    start = time.perf_counter()
    naive = []
    with torch.no_grad():
        for r in requests:
            naive_model.set_adapter(r.adapter)
            out = naive_model.generate(input_ids=torch.tensor([r.prompt_ids]), max_new_tokens=args.max_tokens, do_sample=False,
                                       eos_token_id=eot, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            naive.append(tuple(out[0][len(r.prompt_ids) :].tolist()))
    naive_s = time.perf_counter() - start

    tokens = sum(r.completion_tokens for r in multi)
    same = sum(m.token_ids == n for m, n in zip(multi, naive))
    figures = {
        "rows": len(requests),
        "adapters": ADAPTERS,
        "max_tokens": args.max_tokens,
        "max_batch_rows": args.max_batch_rows,
        "threads": args.threads,
        "generated_tokens": tokens,
        "multi_lora_tok_s": round(tokens / multi_s, 1),
        "sequential_tok_s": round(sum(r.completion_tokens for r in sequential) / sequential_s, 1),
        "naive_tok_s": round(sum(len(t) for t in naive) / naive_s, 1),
        "rows_matching_naive": same,
    }
    figures["ratio_vs_sequential"] = round(figures["multi_lora_tok_s"] / figures["sequential_tok_s"], 2)
    figures["ratio_vs_naive"] = round(figures["multi_lora_tok_s"] / figures["naive_tok_s"], 2)
    for way in ("multi_lora", "sequential", "naive"):
        print(f"{way:>11}: {figures[way + '_tok_s']:8.1f} generated tok/s")
    print(f"multi-LoRA vs sequential {figures['ratio_vs_sequential']}x, vs naive {figures['ratio_vs_naive']}x; "
          f"{same}/{len(requests)} rows token-identical to naive")  # fmt: skip
    print(json.dumps(figures))


def naive_peft_model(base, cache_root: Path, adapters: dict[str, dict[str, bytes]]):
    from peft import PeftModel

    model = load_model(base, ModelSource("standin"), cache_root)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, files) in enumerate(adapters.items()):
            directory = Path(tmp) / name
            directory.mkdir()
            for filename, data in files.items():
                (directory / filename).write_bytes(data)
            if i == 0:
                model = PeftModel.from_pretrained(model, directory, adapter_name=name)
            else:
                model.load_adapter(directory, adapter_name=name)
    return model.eval()


if __name__ == "__main__":
    main()
