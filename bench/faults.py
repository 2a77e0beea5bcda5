"""Fault report: each kind of fault injected into the service, with how many runs survived it (the
job ended in its defined state with nothing lost: one model, one charge, coherent events, or a
failure with its code) and how many lost something.

It runs the fault tests themselves, so a "survived" is exactly a passing test's assertions:
  real runs     tests/faults (real Ray Train runs on the stand-in; `--rounds` times): SIGKILL of the
                serve process group (SQLite, PostgreSQL), ray.kill of the controller, SIGKILL of the
                Train worker (once, twice), SIGSTOP of it, PostgreSQL restarted, S3 stopped, a time
                limit shorter than the run's start;
  in-process    tests/jobs (the real controller with scripted runs; `--quick-rounds` times): a run
                thread that dies, a controller that dies (the lease hands over), a cancel racing a
                start, a stalled run, and 200 random requests against the running controller.
Each round is one pytest process with a JUnit report. The last line printed is one JSON object.

    python bench/faults.py [--rounds 1] [--quick-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = {
    "test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once[sqlite]": "serve SIGKILL + restart (SQLite)",
    "test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once[postgres]": "serve SIGKILL + restart (PostgreSQL)",
    "test_ray_kill_of_the_controller_actor_mid_run_resumes_scheduling_and_the_job_finishes": "ray.kill controller actor",
    "test_sigkill_of_the_train_worker_mid_step_resumes_from_its_checkpoint": "SIGKILL Train worker",
    "test_a_train_worker_lost_twice_fails_platform_interrupted": "SIGKILL Train worker twice",
    "test_a_hung_train_worker_is_stopped_by_the_stall_watchdog": "SIGSTOP Train worker (stall)",
    "test_a_time_limit_shorter_than_the_runs_start_stops_it": "time limit before the first step",
    "test_postgres_restarted_mid_job_is_ridden_through": "PostgreSQL restart",
    "test_s3_stopped_mid_run_and_started_again_never_succeeds_without_its_adapter": "S3 server stopped + started",
}
QUICK = {
    "test_a_run_whose_thread_died_is_requeued_at_the_next_pass": "run thread dies",
    "test_two_controllers_never_both_drive_a_job_and_the_lease_hands_over": "controller dies, lease hands over",
    "test_a_cancel_committed_during_a_start_pass_wins": "cancel racing a start (PostgreSQL)",
    "test_a_stalled_run_is_stopped_and_fails_training_failed": "stalled run",
    "test_random_requests_against_the_running_controller_keep_every_invariant": "200 random requests",
}


def kind_of(name: str, kinds: dict[str, str]) -> str | None:
    if name in kinds:
        return kinds[name]
    base, _, param = name.partition("[")
    if base in kinds:
        return f"{kinds[base]} ({param.rstrip(']').split('-')[0]})" if param else kinds[base]
    return None


def run_round(args: list[str], kinds: dict[str, str], counts: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args],
                       cwd=ROOT, check=False)
        for case in ET.parse(report).iter("testcase"):
            kind = kind_of(case.get("name", ""), kinds)
            if kind is None or case.find("skipped") is not None:
                continue
            lost = case.find("failure") is not None or case.find("error") is not None
            counts[kind]["lost" if lost else "survived"] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the real-run fault tests")
    parser.add_argument("--quick-rounds", type=int, default=3, help="rounds of the in-process fault tests")
    opts = parser.parse_args()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"survived": 0, "lost": 0})
    for _ in range(opts.quick_rounds):
        run_round(["tests/jobs/test_controller.py", "tests/jobs/test_interleaving.py", "-k",
                   " or ".join(QUICK)], QUICK, counts)
    for _ in range(opts.rounds):
        run_round(["-m", "faults", "tests/faults"], REAL, counts)
    width = max(map(len, counts), default=10)
    print(f"\n{'fault':<{width}}  survived  lost")
    for kind, c in counts.items():
        print(f"{kind:<{width}}  {c['survived']:>8}  {c['lost']:>4}")
    total = {k: sum(c[k] for c in counts.values()) for k in ("survived", "lost")}
    print(json.dumps({"kinds": dict(counts), **total}))
    return 1 if total["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
