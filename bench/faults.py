"""Fault report: each kind of fault injected into the service, and each kind of background work it
hit (runs, distills, batches, eval runs, merges, webhook deliveries), with how many survived it (the work
ended in its defined state with nothing lost: one model, one charge, coherent events; every
custom_id once; the merge's digests; the distilled files once; every event delivered and recorded
once) and how many lost something.

It runs the fault tests themselves, so a "survived" is exactly a passing test's assertions:
  real runs     tests/faults (`--rounds` times): SIGKILL of the serve process group mid-training
                (SQLite, PostgreSQL) and mid-batch, mid-merge, mid-distill and mid-delivery
                (PostgreSQL), ray.kill of the controller mid-run and mid-batch, mid-eval-run and mid-merge,
                SIGKILL of the Train worker (once, twice), SIGSTOP of it, PostgreSQL restarted
                mid-run and mid-batch and mid-merge, S3 stopped, a time limit shorter than the
                run's start;
  in-process    tests/worker (the real controller with scripted runs; `--quick-rounds` times): a
                run thread that dies, a controller that dies (the lease hands over), a cancel
                racing a start, a stalled run, and 200 random requests against the running controller.
A test that puts several kinds of work through one fault records each kind that survived
(`record_property("survived:<kind>", 1)`); a kind it did not record was lost. Each round is one
pytest process with a JUnit report. The last line printed is one JSON object.

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
RUN = ("run",)
ALL = ("batch", "merge", "distill", "delivery")
# test -> (fault, the kinds of work it puts through that fault)
REAL = {
    "test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once[sqlite]":
        ("serve SIGKILL + restart (SQLite)", RUN),
    "test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once[postgres]":
        ("serve SIGKILL + restart (PostgreSQL)", RUN),
    "test_sigkill_mid_batch_merge_distill_and_delivery_then_a_restart_ends_each_once":
        ("serve SIGKILL + restart (PostgreSQL)", ALL),
    "test_ray_kill_of_the_controller_actor_mid_run_resumes_scheduling_and_the_job_finishes":
        ("ray.kill controller actor", RUN),
    "test_ray_kill_of_the_controller_mid_batch_and_mid_merge_hands_both_over": ("ray.kill controller actor", ("batch", "merge")),
    "test_ray_kill_of_the_controller_mid_eval_run_hands_it_over": ("ray.kill controller actor (PostgreSQL)", ("eval_run",)),
    "test_sigkill_of_the_train_worker_mid_step_resumes_from_its_checkpoint": ("SIGKILL Train worker", RUN),
    "test_a_train_worker_lost_twice_fails_platform_interrupted": ("SIGKILL Train worker twice", RUN),
    "test_a_hung_train_worker_is_stopped_by_the_stall_watchdog": ("SIGSTOP Train worker (stall)", RUN),
    "test_a_time_limit_shorter_than_the_runs_start_stops_it": ("time limit before the first step", RUN),
    "test_postgres_restarted_mid_job_is_ridden_through": ("PostgreSQL restart", RUN),
    "test_postgres_restarted_mid_batch_and_mid_merge_both_end_once": ("PostgreSQL restart", ("batch", "merge")),
    "test_s3_stopped_mid_run_and_started_again_never_succeeds_without_its_adapter": ("S3 server stopped + started", RUN),
}
QUICK = {
    "test_a_run_whose_thread_died_is_requeued_at_the_next_pass": ("run thread dies", RUN),
    "test_two_controllers_never_both_drive_a_job_and_the_lease_hands_over": ("controller dies, lease hands over", RUN),
    "test_a_cancel_committed_during_a_start_pass_wins": ("cancel racing a start (PostgreSQL)", RUN),
    "test_a_stalled_run_is_stopped_and_fails_training_failed": ("stalled run", RUN),
    "test_random_requests_against_the_running_controller_keep_every_invariant": ("200 random requests", RUN),
}


def kind_of(name: str, tests: dict) -> tuple[str, tuple[str, ...]] | None:
    if name in tests:
        return tests[name]
    base, _, param = name.partition("[")
    if base in tests:
        fault, kinds = tests[base]
        return (f"{fault} ({param.rstrip(']').split('-')[0]})" if param else fault), kinds
    return None


def run_round(args: list[str], tests: dict, counts: dict, by_kind: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        "-o", "junit_family=xunit1", *args], cwd=ROOT, check=False)
        for case in ET.parse(report).iter("testcase"):
            found = kind_of(case.get("name", ""), tests)
            if found is None or case.find("skipped") is not None:
                continue
            fault, kinds = found
            failed = case.find("failure") is not None or case.find("error") is not None
            recorded = {p.get("name", "").removeprefix("survived:") for p in case.iter("property")}
            for kind in kinds:
                # One kind per test: the test's outcome. Several: each kind the test recorded before any failure.
                survived = not failed and (len(kinds) == 1 or kind in recorded)
                outcome = "survived" if survived else "lost"
                counts[f"{fault}: {kind}"][outcome] += 1
                by_kind[kind][outcome] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the real-run fault tests")
    parser.add_argument("--quick-rounds", type=int, default=3, help="rounds of the in-process fault tests")
    opts = parser.parse_args()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"survived": 0, "lost": 0})
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: {"survived": 0, "lost": 0})
    for _ in range(opts.quick_rounds):
        run_round(["tests/worker/test_controller.py", "tests/worker/test_interleaving.py", "-k",
                   " or ".join(QUICK)], QUICK, counts, by_kind)
    for _ in range(opts.rounds):
        run_round(["-m", "faults", "tests/faults"], REAL, counts, by_kind)
    width = max(map(len, counts), default=10)
    print(f"\n{'fault: kind of work':<{width}}  survived  lost")
    for fault, c in counts.items():
        print(f"{fault:<{width}}  {c['survived']:>8}  {c['lost']:>4}")
    total = {k: sum(c[k] for c in counts.values()) for k in ("survived", "lost")}
    missing = [kind for kind in ("run", *ALL, "eval_run") if kind not in by_kind]
    print(json.dumps({"by_kind": dict(by_kind), "faults": dict(counts), **total, "kinds_not_run": missing}))
    return 1 if total["lost"] or missing else 0


if __name__ == "__main__":
    sys.exit(main())
