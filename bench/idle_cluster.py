"""Benchmark of a local node's upkeep: the CPU that `openft serve`'s processes spend while nothing is
asked of them, with the environment it gives a local Ray (entrypoints/ray_runtime.py `LOCAL_RAY_ENV`:
Serve's control loop every 0.5 s, the log monitor's file listing every 5 s) against Ray's defaults
(every 0.1 s, and every 0.1 s under 1,000 log files).

Each side is a real `openft serve` (SQLite, stand-in bases, a local Ray of its own) started in a
process group of its own; once its API answers and a settling time has passed, the CPU time of
every process carrying the side's marker in its environment (Ray's processes inherit it) is summed
over a window, per process title. The sides alternate for `--rounds`; each figure is the median of
its rounds in CPU seconds per minute; the ratio is baseline / ours. The last line printed is one
JSON object.

    python bench/idle_cluster.py [--rounds 2] [--window 60] [--settle 15]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from entrypoints.ray_runtime import LOCAL_RAY_ENV  # noqa: E402
from tests.utils.ports import free_port  # noqa: E402

# Ray 2.60's own values of the same settings.
RAY_DEFAULTS = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "1000",
                "LOG_NAME_UPDATE_INTERVAL_S": "0.5"}
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_by_title(marker: str) -> dict[int, tuple[str, float]]:
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry.name)] = (" ".join(title.split()[:1])[-60:] if not title.startswith("ray::") else title.split()[0],
                                  (int(fields[11]) + int(fields[12])) / TICK)
    return found


def one_side(upkeep: dict[str, str], *, window: float, settle: float) -> tuple[float, Counter]:
    marker = f"OPENFT_BENCH_MARK=idle-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="oft-idle-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OPENFT_"))}
        env.update(upkeep, OPENFT_DATA_DIR=tmp, OPENFT_MODEL_SOURCE="standin", RAY_USAGE_STATS_ENABLED="0",
                   OPENFT_BENCH_MARK=marker.split("=", 1)[1])
        log = Path(tmp) / "serve.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(free_port())],
                                       cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 300
            while b"openft API:" not in log.read_bytes():  # printed once the API answers
                if process.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"openft serve did not start: {log.read_text()[-2000:]}")
                time.sleep(1)
            time.sleep(settle)
            before = _cpu_by_title(marker)
            time.sleep(window)
            after = _cpu_by_title(marker)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    spent = Counter()
    for pid, (title, cpu) in after.items():
        spent[title] += cpu - before.get(pid, (title, 0.0))[1]
    return sum(spent.values()) * 60 / window, spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--settle", type=float, default=15)
    args = ap.parse_args()
    figures: dict[str, list[float]] = {"ours": [], "ray_defaults": []}
    for _ in range(args.rounds):
        for side, upkeep in (("ray_defaults", RAY_DEFAULTS), ("ours", LOCAL_RAY_ENV)):
            per_minute, spent = one_side(upkeep, window=args.window, settle=args.settle)
            figures[side].append(per_minute)
            top = ", ".join(f"{title} {cpu:.2f}" for title, cpu in spent.most_common(4))
            print(f"{side:13s} {per_minute:6.2f} CPU-s/min  ({top})", flush=True)
    ours, base = statistics.median(figures["ours"]), statistics.median(figures["ray_defaults"])
    print(json.dumps({"bench": "idle_cluster", "ours_cpu_s_per_min": round(ours, 2),
                      "ray_defaults_cpu_s_per_min": round(base, 2), "ratio": round(base / ours, 2),
                      "rounds": args.rounds, "window_s": args.window}))


if __name__ == "__main__":
    main()
