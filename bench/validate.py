"""Benchmark of upload validation on a realistic 64 MiB chat file.

Times, best of three, in one process:
  floor    bare `orjson.loads` of every line (with the split into lines),
  inline   `StreamingValidator` fed 1 MiB chunks, checking every line (a small upload),
  ray      `build_validation` over the whole stored file with Ray already started,
  upload   what a 64 MiB upload really runs: the streaming validator checks the first 8 MiB in
           full and splits the rest, then `build_validation` checks the rest from the handoff.
The Ray Data job's own start (planning, scheduling, task launch) is inside every Ray timing;
`ray.init` is not, nor are the first imports in fresh worker processes, which the first job
(`ray_cold_s`) pays and a long-running server does not. The last line printed is one JSON object.

    python bench/validate.py [--mib 64] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entrypoints.ray_runtime import prepare_ray_environment, start_ray  # noqa: E402
from openft.settings import Settings  # noqa: E402

# The service's own Ray start-up (token auth, files under a data dir), prepared before ray's import.
BENCH_DIR = Path(tempfile.mkdtemp(prefix="openft-bench-"))
RAY_SETTINGS = Settings(data_dir=BENCH_DIR / "ray-home")
prepare_ray_environment(RAY_SETTINGS)

from pipelines.validate import FileStats, StreamingValidator  # noqa: E402
from pipelines.validate_ray import build_validation  # noqa: E402
from storage.objects import open_object_store  # noqa: E402

CHUNK = 1 << 20
HANDOFF = 8 << 20
WORDS = (
    "the parcel order refund invoice customer support ticket delivery address account password "
    "reset shipping window warehouse courier tracking number status update please thanks again "
    "schedule meeting tomorrow report summary quarterly revenue growth forecast analysis model "
    "training data python function returns list dict error exception stack trace line file "
    "a an of to in is it for on with as at by from this that we you they be are was were"
).split()
# One word in 200 is not ASCII (names, curly quotes, other scripts): about half the messages hold one.
RARE = "über café naïve “quoted” déjà résumé 東京 데이터 данные".split()


def make_file(target: int, seed: int) -> bytes:
    """Chat rows until just under `target` bytes: mostly short exchanges, some multi-turn, a few long."""
    rng = random.Random(seed)
    corpus = " ".join(rng.choice(RARE) if rng.random() < 0.005 else rng.choice(WORDS) for _ in range(400_000))

    def text(lo: int, hi: int) -> str:
        n = rng.randint(lo, hi)
        start = rng.randrange(0, len(corpus) - n)
        return corpus[start : start + n]

    out, size = [], 0
    while True:
        kind = rng.random()
        if kind < 0.05:  # long documents to summarise
            turns = [text(8_000, 60_000), text(300, 2_000)]
        elif kind < 0.35:  # multi-turn conversations
            turns = [text(20, 600) for _ in range(2 * rng.randint(2, 6))]
        else:
            turns = [text(20, 800), text(10, 1_200)]
        messages = [{"role": "system", "content": text(20, 200)}] if rng.random() < 0.7 else []
        messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
        line = orjson.dumps({"messages": messages}) + b"\n"
        if size + len(line) > target:
            return b"".join(out)
        out.append(line)
        size += len(line)


def best_of(n: int, fn: Callable[[], object]) -> tuple[float, object]:
    times, result = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--range-mib-max", type=int, default=64,
                        help="largest Ray Data range (settings.validate_range_bytes_max); the tail is split evenly over the CPUs")
    args = parser.parse_args()

    block_bytes = args.range_mib_max << 20
    data = make_file(args.mib << 20, args.seed)
    mb = len(data) / 1e6
    tmp = BENCH_DIR
    store = open_object_store(f"file://{tmp}/objects")
    key = "files/bench/file-validate"
    store.put_bytes(key, data)

    def floor() -> int:
        n = 0
        for line in data.split(b"\n")[:-1]:
            orjson.loads(line)
            n += 1
        return n

    def inline(full_check_bytes: int | None = None) -> tuple[StreamingValidator, FileStats]:
        v = StreamingValidator("fine-tune", full_check_bytes=full_check_bytes)
        for i in range(0, len(data), CHUNK):
            v.feed(data[i : i + CHUNK])
        return v, v.finish()

    def upload() -> FileStats:
        v, head = inline(HANDOFF)
        return build_validation(
            store.spec(), key, "fine-tune", start_offset=v.checked_offset, start_line=v.checked_line, head_stats=head,
            block_bytes=block_bytes,
        )

    floor_s, rows = best_of(args.repeat, floor)
    inline_s, (_, stats) = best_of(args.repeat, inline)
    assert stats.rows == rows

    import ray

    start_ray(RAY_SETTINGS, dashboard=False)
    cold_s, _ = best_of(1, lambda: build_validation(store.spec(), key, "fine-tune", block_bytes=block_bytes))
    ray_s, ray_stats = best_of(args.repeat, lambda: build_validation(store.spec(), key, "fine-tune", block_bytes=block_bytes))
    upload_s, upload_stats = best_of(args.repeat, upload)
    ray.shutdown()
    shutil.rmtree(tmp)
    assert ray_stats == upload_stats == stats

    figures = {
        "bytes": len(data),
        "rows": rows,
        "cpus": os.cpu_count(),
        "range_bytes_max": block_bytes,
        "floor_mb_s": round(mb / floor_s, 1),
        "inline_mb_s": round(mb / inline_s, 1),
        "ray_mb_s": round(mb / ray_s, 1),
        "upload_mb_s": round(mb / upload_s, 1),
        "ray_cold_s": round(cold_s, 3),
        "ratio": round(floor_s / upload_s, 3),
        "ratio_inline": round(floor_s / inline_s, 3),
        "ratio_ray": round(floor_s / ray_s, 3),
    }
    for name in ("floor", "inline", "ray", "upload"):
        print(f"{name:>7}: {figures[f'{name}_mb_s']:8.1f} MB/s", file=sys.stderr)
    print(f"   file: {len(data):,} bytes, {rows:,} rows", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
