"""Benchmark of distillation: 200,000 batch results through the Ray Data job vs one Python process.

Both paths read the stored results and requests files and write train.jsonl and eval.jsonl:
  local  `distill_local` over the stored files' chunks, then two `put_bytes` (the straightforward
         single-process implementation of the same rules),
  ray    `build_distill`, Ray already started (its first job, `ray_cold_s`, pays worker imports
         and is not counted), best of `--repeat`; and the same job capped at 1 CPU
         (`max_cpus=1`) to show how it scales with the CPUs it may use.
Rows per second count results in (kept or dropped). The files come from `tests.factories`'s
`distill_files` (every drop reason, 70% system prompts, some multi-turn requests). The outputs
of every run are checked byte-identical to the local ones. The last line is one JSON object.

    python bench/distill.py [--results 200000] [--format openai] [--seed 7] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.validate import best_of  # noqa: E402
from pipelines.distill import DistillOptions, distill_local  # noqa: E402
from pipelines.distill_ray import build_distill  # noqa: E402
from storage.objects import open_object_store  # noqa: E402
from tests.factories import distill_files  # noqa: E402

RESULTS, REQUESTS, OUT = "files/bench/results", "files/bench/requests", "distill/bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=int, default=200_000)
    parser.add_argument("--format", choices=("openai", "anthropic"), default="openai")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    results, requests, _ = distill_files(args.format, args.results, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="openft-bench-"))
    store = open_object_store(f"file://{tmp}/objects")
    store.put_bytes(RESULTS, results)
    store.put_bytes(REQUESTS, requests)
    options = DistillOptions()

    def local() -> tuple[bytes, bytes, dict]:
        out = distill_local(store.iter_chunks(RESULTS), store.iter_chunks(REQUESTS), options)
        store.put_bytes(f"{OUT}-local/train.jsonl", out[0])
        store.put_bytes(f"{OUT}-local/eval.jsonl", out[1])
        return out

    def on_ray(max_cpus: float | None = None) -> tuple[bytes, bytes, dict]:
        out = build_distill(store.spec(), RESULTS, REQUESTS, OUT, options, max_cpus=max_cpus)
        return store.get_bytes(out.train_key), store.get_bytes(out.eval_key), out.dropped

    local_s, expected = best_of(args.repeat, local)

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(include_dashboard=False, _temp_dir=f"/tmp/openft-ray-{os.getpid()}", address="local", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cpus = ray.cluster_resources().get("CPU")
    cold_s, _ = best_of(1, on_ray)
    ray_s, got = best_of(args.repeat, on_ray)
    one_cpu_s, got_one = best_of(args.repeat, lambda: on_ray(1))
    ray.shutdown()
    shutil.rmtree(tmp)
    assert got == got_one == expected, "the Ray job's files differ from the local ones"

    n = args.results
    figures = {
        "results": n,
        "format": args.format,
        "results_bytes": len(results),
        "requests_bytes": len(requests),
        "train_rows": expected[0].count(b"\n"),
        "eval_rows": expected[1].count(b"\n"),
        "ray_cpus": cpus,
        "local_rows_s": round(n / local_s),
        "ray_rows_s": round(n / ray_s),
        "ray_1cpu_rows_s": round(n / one_cpu_s),
        "ray_cold_s": round(cold_s, 2),
        "scaling_all_vs_1cpu": round(one_cpu_s / ray_s, 3),
        "ratio": round(local_s / ray_s, 3),
    }
    for name in ("local", "ray", "ray_1cpu"):
        print(f"{name:>9}: {figures[f'{name}_rows_s']:>9,} results/s", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
