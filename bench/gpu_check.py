"""GPU readiness check: the training, merge, batch and reinforcement paths on one GPU, in one go,
within a hard overall budget (8 minutes, installs included).

Each stage runs our own code (train/sft.py, train/dpo.py, merge/run.py, pipelines/generate.py,
pipelines/_vllm_engine.py, train/parity.py, the Ray Data jobs) in a process of its own, under a
time limit: a stage that fails or runs out of time records its error and the next stage runs.
One JSON line is printed per stage as it ends, then one summary line. docs/gpu-check.md
describes every stage and its JSON.

    python3 bench/gpu_check.py [--out FILE] [--work DIR] [--budget-s 480] [--stages a,b]
    .venv/bin/python bench/gpu_check.py --tiny      # the CPU smoke: every stage on a stand-in
    .venv/bin/python bench/gpu_check.py --pack      # here, before a device run: bench/out/carry/

This file imports only the standard library: on the GPU machine it runs before anything is
installed. The stages live in bench/_gpu_*.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480.0  # the whole check, installs included
TINY_BUDGET_S = 1200.0  # the smoke's: it runs on shared cores, where a loaded machine takes minutes more
MIN_STAGE_S = 8.0  # a stage is not started with less than this left
MEMORY_BUDGET_GIB = 48.0  # production trains on 48 GB-class GPUs
TINY_STAGE_S = 180.0  # the smoke's limit per stage: far above its needs, for a loaded machine


@dataclass(frozen=True)
class Stage:
    name: str
    module: str  # bench/<module>.py holds `stage_<name>(ctx)`
    budget_s: float  # at most this long on the GPU (the overall budget caps it further)
    needs: tuple[str, ...] = ()  # stages whose output this one reads
    cuda_only: str | None = None  # why the stage cannot run at all without CUDA


# In priority order: the training paths first, the CPU-bound Ray Data stage last.
STAGES = (
    Stage("install", "_gpu_install", 50),
    Stage("base", "_gpu_train", 60, ("install",)),
    Stage("sft", "_gpu_train", 80, ("base",)),
    Stage("long_context", "_gpu_train", 45, ("base",)),
    Stage("qlora", "_gpu_train", 50, ("base", "sft"),
          cuda_only="bitsandbytes' NF4 4-bit kernels are the GPU path; QLoRA has no CPU production path"),
    Stage("dpo", "_gpu_train", 40, ("base", "sft")),
    Stage("nccl", "_gpu_cluster", 20, ("install",)),
    Stage("merge", "_gpu_serve", 55, ("base", "sft")),
    Stage("batch", "_gpu_serve", 40, ("base", "sft")),
    Stage("parity", "_gpu_serve", 70, ("base", "sft")),
    Stage("rft", "_gpu_train", 20, ("base",)),
    Stage("ray_data", "_gpu_cluster", 60, ("install",)),
)  # fmt: skip
BY_NAME = {s.name: s for s in STAGES}


def _result(stage: str, status: str, **kw) -> dict:
    out = {"stage": stage, "status": status, "seconds": 0.0, "reason": None, "error": None, "figures": {}, "parts": {},
           "peak_memory": None}  # fmt: skip
    out.update(kw)
    return out


def _memory_verdict(peak: dict | None) -> dict | None:
    if not peak:
        return None
    gib = peak["peak_bytes"] / 2**30
    return {**peak, "peak_gib": round(gib, 2), "budget_gib": MEMORY_BUDGET_GIB, "over_budget": gib > MEMORY_BUDGET_GIB}


def _stage_env(site: str | None, tiny: bool) -> dict:
    """The stage processes' environment: the repository (and the carried packages) on the path,
    and nothing that would join another Ray cluster or change our settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENFT_", "RAY_ADDRESS"))}
    if tiny:
        env["OMP_NUM_THREADS"] = "1"  # the smoke shares a few cores: one thread per process is steadiest
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *([site] if site else [])])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing is reachable: never wait on a hub
    return env


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run_stage(stage: Stage, ctx: dict, timeout_s: float) -> dict:
    """`stage` in a process (group) of its own; its result JSON, or a failed / timed-out result."""
    work = Path(ctx["work"])
    result_path, log_path = work / "results" / f"{stage.name}.json", work / "logs" / f"{stage.name}.log"
    result_path.unlink(missing_ok=True)
    ctx_path = work / "results" / f"{stage.name}.ctx.json"
    ctx_path.write_text(json.dumps({**ctx, "stage": stage.name, "timeout_s": timeout_s}))
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--run-stage", str(ctx_path)],
            cwd=REPO, env=_stage_env(ctx["site"], ctx["tiny"]), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the stage and whatever it started (Ray, a vLLM engine)
            proc.wait()
            return _result(stage.name, "timeout", seconds=round(time.monotonic() - started, 2),
                           error=f"ran past its {timeout_s:.0f} s", log_tail=_tail(log_path))  # fmt: skip
    seconds = round(time.monotonic() - started, 2)
    if result_path.exists():
        out = json.loads(result_path.read_text())
        out["seconds"] = seconds
        out["peak_memory"] = _memory_verdict(out.get("peak_memory"))
        return out
    return _result(stage.name, "failed", seconds=seconds, error=f"the stage process exited with {rc} and no result",
                   log_tail=_tail(log_path))  # fmt: skip


def worker(ctx_path: str) -> None:
    """One stage, in this process: calls `stage_<name>(ctx)` and writes its result for the driver.
    A stage returns {"figures", "parts"} (ran), or raises `Skip` (skipped with its reason)."""
    import importlib
    import traceback

    sys.path.insert(0, str(REPO))
    from bench._gpu_common import Ctx, Skip, peak_memory

    raw = json.loads(Path(ctx_path).read_text())
    ctx = Ctx.from_json(raw)
    stage = BY_NAME[raw["stage"]]
    fn = getattr(importlib.import_module(f"bench.{stage.module}"), f"stage_{stage.name}")
    try:
        out = fn(ctx)
        result = _result(stage.name, "ok", figures=out.get("figures", {}), parts=out.get("parts", {}))
    except Skip as skip:
        result = _result(stage.name, "skipped", reason=skip.reason, parts=skip.parts)
    except Exception as exc:  # recorded, and the driver runs the next stage
        result = _result(stage.name, "failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                         traceback=traceback.format_exc()[-3000:])  # fmt: skip
    result["peak_memory"] = peak_memory()
    (Path(raw["work"]) / "results" / f"{stage.name}.json").write_text(json.dumps(result))


def summarize(results: list[dict], started: float, budget_s: float, machine: dict) -> dict:
    by = {r["stage"]: r for r in results}
    sft = by.get("sft", {}).get("figures", {})
    mfu = sft.get("ours", {}).get("mfu")
    ratio = sft.get("ratio_vs_trl_tuned")
    over = [r["stage"] for r in results if (r.get("peak_memory") or {}).get("over_budget")]
    gpu = bool(machine.get("cuda"))  # the targets are a GPU day's: a CPU run says nothing about them
    targets = {
        "sft_vs_trl_tuned_at_least_1_5": None if ratio is None or not gpu else ratio >= 1.5,
        "sft_mfu_at_least_0_40": None if mfu is None or not gpu else mfu >= 0.40,
        "every_stage_within_48gb": not over,
    }
    return {
        "summary": True,
        "machine": machine,
        "budget_s": budget_s,
        "wall_s": round(time.monotonic() - started, 2),
        "stages": {r["stage"]: r["status"] for r in results},
        "reasons": {r["stage"]: r.get("reason") or r.get("error") for r in results if r["status"] != "ok"},
        "failed_parts": [f"{r['stage']}.{name}" for r in results for name, part in (r.get("parts") or {}).items()
                         if part.get("status") == "failed"],
        "over_memory_budget": over,
        "targets": targets,
        "missed": [k for k, v in targets.items() if v is False],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the CPU smoke: every stage on a stand-in, small sizes")
    ap.add_argument("--out", help="also write every JSON line to this file")
    ap.add_argument("--work", help="working directory (bases, adapters, logs); a fresh temporary one by default")
    ap.add_argument("--budget-s", type=float, help=f"overall budget (default {BUDGET_S:.0f} s, with --tiny {TINY_BUDGET_S:.0f} s)")
    ap.add_argument("--stages", help="comma-separated subset, in the check's order")
    ap.add_argument("--carry", default=str(REPO / "bench" / "out" / "carry"), help="the carried packages (--pack)")
    ap.add_argument("--use-carry", action="store_true", help="with --tiny: install the carried packages too")
    ap.add_argument("--pack", action="store_true", help="build the carried packages for the GPU machine, here")
    ap.add_argument("--pack-python", default="3.12", help="the GPU machine's Python version (--pack)")
    ap.add_argument("--run-stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_stage:
        return worker(args.run_stage)
    if args.pack:
        sys.path.insert(0, str(REPO))
        from bench._gpu_install import pack

        print(json.dumps(pack(Path(args.carry), args.pack_python)))
        return

    args.budget_s = args.budget_s or (TINY_BUDGET_S if args.tiny else BUDGET_S)
    started = time.monotonic()
    deadline = started + args.budget_s
    work = Path(args.work or tempfile.mkdtemp(prefix="openft-gpu-check-")).resolve()
    for sub in ("results", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    wanted = set(args.stages.split(",")) if args.stages else None
    if wanted and wanted - set(BY_NAME):
        ap.error(f"unknown stages: {', '.join(sorted(wanted - set(BY_NAME)))}")
    out = open(args.out, "a") if args.out else None
    ctx = {"tiny": args.tiny, "work": str(work), "repo": str(REPO), "carry": args.carry,
           "use_carry": args.use_carry or not args.tiny, "cuda": False, "site": None, "machine": {}, "results": {}}  # fmt: skip
    results = []
    for stage in STAGES:  # a reused --work keeps what earlier runs produced: a rerun of some stages reads it
        earlier = work / "results" / f"{stage.name}.json"
        if wanted and stage.name not in wanted and earlier.exists():
            _absorb(ctx, json.loads(earlier.read_text()))

    def emit(record: dict) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    for stage in STAGES:
        if wanted and stage.name not in wanted:
            continue
        left = deadline - time.monotonic()
        missing = [n for n in stage.needs if ctx["results"].get(n, {}).get("status") != "ok"]
        if missing:
            result = _result(stage.name, "skipped", reason=f"needs stage {missing[0]}, which did not run to the end here "
                                                           "(run it in the same check, or reuse a --work where it did)")
        elif stage.cuda_only and not ctx["cuda"]:
            result = _result(stage.name, "skipped", reason=f"no CUDA: {stage.cuda_only}")
        elif left < MIN_STAGE_S:
            result = _result(stage.name, "skipped", reason=f"the overall budget of {args.budget_s:.0f} s is spent")
        else:
            result = run_stage(stage, ctx, min(stage.budget_s if not args.tiny else TINY_STAGE_S, left))
        results.append(result)
        _absorb(ctx, result)
        emit(result)
    emit({**summarize(results, started, args.budget_s, ctx["machine"]), "work": str(work)})
    if out:
        out.close()
    if args.tiny and not args.work:
        shutil.rmtree(work, ignore_errors=True)  # a GPU run keeps its directory: its logs are worth a look


def _absorb(ctx: dict, result: dict) -> None:
    """What later stages read of a stage's result; the install stage's also sets where and on what they run."""
    ctx["results"][result["stage"]] = {"status": result["status"], "figures": result["figures"]}
    if result["stage"] == "install" and result["status"] == "ok":
        ctx["site"] = result["figures"].get("site_dir")
        ctx["machine"] = result["figures"].get("machine", {})
        ctx["cuda"] = bool(ctx["machine"].get("cuda"))


if __name__ == "__main__":
    main()
