"""Benchmark of the job controller's idle pass (worker/controller.py `Controller.tick`): the CPU one
pass costs when nothing waits, against the pass as it was before it asked which kinds have a row
due (storage/leases.py `due_kinds`): every kind reconciled and claimed in every pass (a dozen
statements and the scheduler's lock each), and the sweeps and the jobs gauge in every pass too.

The suites' controllers pass every 0.3 to 0.5 s (the product's every 1 s) for as long as a suite
runs, and an idle pass is what most of them are. Ours sweeps every `controller_sweep_seconds`
(5 s): it is charged a sweep every `--sweep-every` passes (5: the product's 1 s poll; the suites'
polls sweep less often).

Both sides run in one process, on one local Ray and one database with nothing queued (SQLite, and
PostgreSQL with `--database-url`), alternating in rounds; each figure is the median of the rounds,
in ms of this process's CPU time per pass. The ratio is baseline / ours. The last line printed is
one JSON object.

    python bench/controller_pass.py [--passes 40] [--rounds 5] [--sweep-every 5] [--database-url URL]
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
    ap.add_argument("--sweep-every", type=int, default=5)
    ap.add_argument("--database-url", default=None)
    args = ap.parse_args()

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    from openft.settings import Settings
    from worker.controller import Controller

    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="oft-bench-")), model_source="standin",
                        database_url=args.database_url)
    ctl = Controller(settings)

    def ours(i: int) -> None:
        if i % args.sweep_every == 0:
            ctl.swept_at = float("-inf")  # this pass sweeps
        ctl.tick()

    def baseline(i: int) -> None:  # the pass before `due_kinds`: every kind, the sweeps and the gauge each time
        ctl.sweep()
        ctl.reconcile()
        for work in ctl.work:
            work.claim(int(time.time()))

    def ms_per_pass(one) -> float:
        started = time.process_time()
        for i in range(args.passes):
            one(i)
        return (time.process_time() - started) / args.passes * 1000

    ours(0), baseline(0)  # warm-up: imports, the database's first connections
    rounds = {"ours": [], "baseline": []}
    for _ in range(args.rounds):
        rounds["ours"].append(ms_per_pass(ours))
        rounds["baseline"].append(ms_per_pass(baseline))
    figures = {name: round(statistics.median(values), 2) for name, values in rounds.items()}
    database = "postgresql" if args.database_url else "sqlite"
    print(f"idle controller pass on {database}, CPU ms per pass (median of {args.rounds} rounds of {args.passes}): "
          f"ours {figures['ours']} (a sweep every {args.sweep_every} passes), baseline (every kind and the sweeps "
          f"in every pass) {figures['baseline']}")
    result = {"bench": "controller_pass", "database": database, "passes": args.passes, "rounds": args.rounds,
              "sweep_every": args.sweep_every, "ms_per_pass": figures,
              "ratio_baseline_over_ours": round(figures["baseline"] / figures["ours"], 2)}
    ray.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
