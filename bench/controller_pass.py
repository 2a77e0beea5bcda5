"""Benchmark of the job controller's idle pass (worker/controller.py `Controller.tick`): the CPU one
pass costs when nothing waits, against a baseline that also asks what the cluster holds in each
pass that can start work, as every pass did before it asked only when something waits (issue 23).

The suites' controllers pass every 0.3 s (the product's every 1 s) for as long as a suite runs, and
an idle pass is what most of them are; asking Ray (`ray.cluster_resources` through each kind's
`fit`: runs, batches, eval runs) was the dearest part of one.

Both sides run in one process, on one local Ray and one SQLite database with nothing queued,
alternating in rounds; each figure is the median of the rounds, in ms of this process's CPU time
per pass. The ratio is baseline / ours. The last line printed is one JSON object.

    python bench/controller_pass.py [--passes 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    from openft.settings import Settings
    from worker.controller import Controller

    ctl = Controller(Settings(data_dir=Path(tempfile.mkdtemp(prefix="oft-bench-")), model_source="standin"))
    # What the passes that start work asked of the cluster each time, before they asked only when
    # something waits: the runs' fit, and the batches' fit for the batches and for the eval runs.
    batches = next(work for work in ctl.work if work.kind.name == "batch")
    fits = [ctl.runs_work._fit, batches.fit, batches.fit]

    def ours() -> None:
        ctl.tick()

    def baseline() -> None:
        ctl.tick()
        with ctl.db.session() as session:
            for fit in fits:
                fit(session)

    def ms_per_pass(one) -> float:
        started = time.process_time()
        for _ in range(args.passes):
            one()
        return (time.process_time() - started) / args.passes * 1000

    ours(), baseline()  # warm-up: imports, the database's first connections
    rounds = {"ours": [], "baseline": []}
    for _ in range(args.rounds):
        rounds["ours"].append(ms_per_pass(ours))
        rounds["baseline"].append(ms_per_pass(baseline))
    figures = {name: round(statistics.median(values), 2) for name, values in rounds.items()}
    print(f"idle controller pass, CPU ms per pass (median of {args.rounds} rounds of {args.passes}): "
          f"ours {figures['ours']}, baseline (asking the cluster in each pass) {figures['baseline']}")
    result = {"bench": "controller_pass", "passes": args.passes, "rounds": args.rounds, "cluster_asks_per_pass": len(fits),
              "ms_per_pass": figures, "ratio_baseline_over_ours": round(figures["baseline"] / figures["ours"], 2)}
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
