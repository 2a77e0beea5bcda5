"""Data-parallel step time: the same SFT job through Ray Train (train/launcher.py) on 1 worker and on
2 workers (gloo on CPU, train/parallel.py), in one run, one after the other, on a local Ray
cluster of its own.

The figure is seconds per optimizer step: the run's last metrics `elapsed` (training time from the
first step, epoch-end checkpoint writes included, model load and the first eval not) over its
steps. Each step is the same global batch either way; on 2 workers each rank trains half of it and
the ranks add their gradients. `ratio` is the 2-worker step time over the 1-worker one: below 1
means data parallelism sped the step up. On a machine whose 2 cores are shared (and with the
workers on one node) it shows the overhead of the collectives and of two processes sharing the
cores, not the scaling across GPU nodes. The last line printed is one JSON object.

    .venv/bin/python -m bench.ddp [--rows 96] [--batch-size 8] [--cpus 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

from bench.train_throughput import chat_rows, job_for
from catalog.model_source import ModelSource
from openft.settings import Settings
from pipelines.tokenize import build_tokenized
from storage.objects import open_object_store
from train.launcher import run_training
from train.progress import FileReporter

MAX_SEQ = 512


def step_seconds(log: Path) -> float:
    last = [r["data"] for r in FileReporter(log).records() if r["type"] == "metrics"][-1]
    return last["elapsed"] / last["step"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = parser.parse_args()

    from entrypoints.ray_runtime import start_ray

    tmp = Path(tempfile.mkdtemp(prefix="openft-bench-ddp-"))
    start_ray(Settings(data_dir=tmp / "ray-home"), dashboard=False, num_cpus=args.cpus)
    store = open_object_store(f"file://{tmp / 'objects'}")
    data = b"".join(json.dumps(r).encode() + b"\n" for r in chat_rows(args.rows))
    store.put_bytes("files/bench", data)
    base_job = job_for(store, str(tmp / "models"), args.batch_size)
    ref = build_tokenized(store.spec(), "files/bench", hashlib.sha256(data).hexdigest(), base_job.base_id,
                          ModelSource("standin"), tmp / "models", MAX_SEQ, "supervised")
    # Each worker takes a quarter of the CPUs, so that Ray Data's reads keep the rest.
    worker = {"CPU": args.cpus / 4}
    figures = {}
    for workers in (1, 2):
        job = dataclasses.replace(base_job, job_id=f"ftjob-bench{workers}", run_name=f"bench-{workers}",
                                  max_seq_length=MAX_SEQ, train_prefix=ref.prefix, output_prefix=f"out/{workers}/",
                                  checkpoint_prefix=f"ck/{workers}/")
        log = tmp / f"log-{workers}.jsonl"
        outcome = run_training(job, lambda log=log: FileReporter(log), num_workers=workers, resources_per_worker=worker,
                               storage_path=str(tmp / "runs"))
        assert outcome.status == "succeeded", outcome.error
        figures[workers] = step_seconds(log)
        print(f"{workers} worker(s): {figures[workers]:.3f} s per step, train loss {outcome.result['train_loss']:.4f}",
              flush=True)
    print(json.dumps({"rows": args.rows, "batch_size": args.batch_size, "step_s_1_worker": round(figures[1], 4),
                      "step_s_2_workers": round(figures[2], 4), "ratio": round(figures[2] / figures[1], 3)}))


if __name__ == "__main__":
    main()
