"""Benchmark of what a Ray Train run costs the machine beside its training: the trainer a job's
attempt builds (train/launcher.py `trainer_class`: no placement group cleaner, and no datasets
callback for a run given no datasets, so neither a `PlacementGroupCleaner` nor a `DatasetManager`
actor; for one worker Ray Train's plain backend, so no torch process group, and a controller that
does not import torch) against Ray Train's own `TorchTrainer`, each running a
training function that reports once, on one worker, as a job's attempt does (a Ray task of its own,
with launcher.py's `RAY_TRAIN_ENV`).

What is counted is the whole machine's CPU time (/proc/stat: user, nice and system) from the
attempt's start until `--settle` seconds after it returned (the run's actors exit and Ray reaps
them), so run it on a quiet machine. The sides alternate for `--rounds` after one warm-up run; each
figure is the median of its rounds, in CPU seconds. The ratio is stock / ours. The last line
printed is one JSON object.

    python bench/train_start.py [--rounds 4] [--settle 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return sum(int(v) for v in fields[1:4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--settle", type=float, default=4.0)
    args = ap.parse_args()

    import ray

    from train.launcher import RAY_TRAIN_ENV

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote(num_cpus=0)
    def attempt(side: str, name: str) -> None:
        import ray.train
        from ray.train.torch import TorchTrainer

        from train.launcher import trainer_class

        os.environ.update(RAY_TRAIN_ENV)
        trainer = (trainer_class() if side == "ours" else TorchTrainer)(
            lambda config: ray.train.report({"step": 1}), scaling_config=ray.train.ScalingConfig(num_workers=1),
            run_config=ray.train.RunConfig(name=name, storage_path=tempfile.mkdtemp(prefix="oft-bts-")))
        trainer.fit()

    def one(side: str) -> float:
        time.sleep(args.settle)  # what the last run left exits first
        started = machine_cpu_s()
        ray.get(attempt.remote(side, f"{side}-{time.time_ns()}"))
        time.sleep(args.settle)
        return machine_cpu_s() - started

    one("stock")  # warm-up: Ray Train's state actor, the first imports
    rounds = {"ours": [], "stock": []}
    for _ in range(args.rounds):
        for side in rounds:
            rounds[side].append(one(side))
    figures = {side: round(statistics.median(values), 2) for side, values in rounds.items()}
    print(f"a minimal Ray Train run, machine CPU-s (median of {args.rounds}): ours {figures['ours']}, "
          f"stock TorchTrainer {figures['stock']}")
    ray.shutdown()
    print(json.dumps({"bench": "train_start", "rounds": args.rounds, "settle_s": args.settle, "cpu_s": figures,
                      "samples": rounds, "ratio_stock_over_ours": round(figures["stock"] / figures["ours"], 3)}))


if __name__ == "__main__":
    main()
