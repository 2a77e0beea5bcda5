"""Benchmark of what the service's processes cost to start, ours against what they paid before.

Two parts, each side by side in one run, alternating for `--rounds`, medians of CPU seconds (user +
system of the measured process, exec included):

- Imports: a fresh Python importing each long-lived process's module (the API replica's
  `serve_app.deployment`, the job controller's `worker.controller`) as it does now, against the same
  import after torch, transformers and ray.data, which both imported at start until
  catalog/model_source.py and its callers stopped (tests/test_layout.py keeps it so).
- Adapter code: a fresh Python importing peft as a Train worker and a generation actor do now
  (catalog/model_source.py `import_peft`: the bitsandbytes that peft imports does not compile its
  CPU kernels at import) against a plain `import peft`, then train/lora.py and pipelines/generate.py.
- Ray actors: a trivial actor started on a local Ray whose job has no `runtime_env`, as the service
  starts Ray now (entrypoints/ray_runtime.py), against one whose job carries `env_vars`, as it did:
  a worker started for a runtime_env goes through Ray's setup_worker.py, a second Python start. Each
  actor reports its own process's CPU time.

The ratio is baseline / ours. The last line printed is one JSON object.

    python bench/process_start.py [--rounds 3] [--actors 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_IMPORT = textwrap.dedent("""
    import resource, sys
    for m in sys.argv[2].split(",") if sys.argv[2] else []:
        __import__(m)
    __import__(sys.argv[1])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(usage.ru_utime + usage.ru_stime)  # the whole process: interpreter start, the heavy modules, the module
""")

_ADAPTER = textwrap.dedent("""
    import resource, sys
    if sys.argv[1] == "ours":
        from catalog.model_source import import_peft
        import_peft()
    else:
        import peft
    import pipelines.generate, train.lora
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(usage.ru_utime + usage.ru_stime)
""")

_ACTORS = textwrap.dedent("""
    import json, resource, sys, tempfile
    import ray
    kwargs = {"runtime_env": {"env_vars": {"OPENFT_BENCH": "1"}}} if sys.argv[1] == "runtime_env" else {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="oft-bench-"), **kwargs)

    @ray.remote(num_cpus=0)
    class Probe:
        def cpu(self):
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return usage.ru_utime + usage.ru_stime

    seconds = []
    for _ in range(int(sys.argv[2])):
        probe = Probe.remote()
        seconds.append(ray.get(probe.cpu.remote()))
        ray.kill(probe)
    print(json.dumps(seconds))
    ray.shutdown()
""")

# What the API replica and the job controller imported at start before: torch and transformers
# (catalog/model_source.py at module level) and ray.data (pipelines/distill_ray.py).
HEAVY = "torch,transformers,ray.data"
PROCESSES = {"api replica": "serve_app.deployment", "job controller": "worker.controller"}


def import_cpu(module: str, first: str) -> float:
    out = subprocess.run([sys.executable, "-c", _IMPORT, module, first], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def adapter_cpu(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _ADAPTER, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def actor_cpu(mode: str, actors: int) -> float:
    out = subprocess.run([sys.executable, "-c", _ACTORS, mode, str(actors)], cwd=ROOT, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return statistics.median(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=6)
    args = parser.parse_args()

    result: dict[str, dict] = {}
    for name, module in PROCESSES.items():
        ours, before = [], []
        for _ in range(args.rounds):
            ours.append(import_cpu(module, ""))
            before.append(import_cpu(module, HEAVY))
        result[name] = {"ours_cpu_s": round(statistics.median(ours), 2), "baseline_cpu_s": round(statistics.median(before), 2)}
    ours, before = [], []
    for _ in range(args.rounds):
        ours.append(adapter_cpu("ours"))
        before.append(adapter_cpu("plain"))
    result["adapter code"] = {"ours_cpu_s": round(statistics.median(ours), 2), "baseline_cpu_s": round(statistics.median(before), 2)}
    ours, before = [], []
    for _ in range(args.rounds):
        ours.append(actor_cpu("plain", args.actors))
        before.append(actor_cpu("runtime_env", args.actors))
    result["ray actor"] = {"ours_cpu_s": round(statistics.median(ours), 2), "baseline_cpu_s": round(statistics.median(before), 2)}
    for name, row in result.items():
        row["ratio"] = round(row["baseline_cpu_s"] / row["ours_cpu_s"], 2)
        print(f"{name:15s} ours {row['ours_cpu_s']:5.2f} CPU-s   baseline {row['baseline_cpu_s']:5.2f} CPU-s   ratio {row['ratio']:.2f}")
    print(json.dumps({"bench": "process_start", "rounds": args.rounds, "actors": args.actors, **result}))


if __name__ == "__main__":
    main()
