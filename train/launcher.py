"""Run one training attempt as a Ray Train run and turn its end into a `TrainOutcome`.

Where it sits: the job controller calls `run_training` after tokenizing (pipelines/tokenize.py);
the worker reads the tokenized rows (with `ray.train.get_dataset_shard` when the job's files were
large enough for Ray Data, `TrainJob.ray_data_reads`; from the store otherwise), runs the recipe
(train/sft.py, train/dpo.py or train/rft.py) and returns the outcome as rank 0's return value.

Decisions:
- `num_workers` workers per job (`train_num_workers`, one GPU each on GPU nodes), data parallel
  (train/parallel.py): placed SPREAD, so they go to different nodes when there are several (Ray
  packs them on one node when it must); gloo on CPU, NCCL on GPU (Ray Train's TorchConfig picks by
  whether the workers take GPUs), and no process group for one worker (`trainer_class`). The rows
  are given whole to every worker (Ray Data's datasets with `DataConfig(datasets_to_split=[])`) and
  sorted by line there, so every rank builds the same batch order from the seed alone and trains
  its slice of each batch.
- Rank 0 alone writes: the worker mark, the placement-group record, checkpoints, events, metrics,
  the adapter, and the outcome that `run_training` returns (Ray Train's `return_value` is rank 0's).
- Checkpoints live in the object store under `job.checkpoint_prefix` (train/checkpoint.py), so a
  paused job resumes in a new Ray Train run (`TrainJob.resume`). Each one is also reported to Ray
  Train as a small pointer checkpoint, so that `FailureConfig(max_failures=1)` restarts a lost
  worker with `ray.train.get_checkpoint()` set: the restarted worker reports "worker lost,
  retrying from checkpoint" and resumes from the store. A worker lost before its first checkpoint
  restarts from the beginning. A worker lost again (a process or node that died, not code that
  raised) ends the run `platform_interrupted`; code that raised twice is `training_failed`.
- A `TrainingError` (a job fault: context too long, time limit, ...) is returned as a failed
  outcome, not raised, so Ray Train does not retry something that would fail the same way.
  Any other exception is retried once and then becomes `training_failed`.
- Ray Train V2 reloads a run's state when a RunConfig name is reused: `job.run_name` must be
  unique per attempt (job id + attempt).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from openft.errors import TrainingError
from train.config import TrainJob, TrainOutcome
from train.data import split_holdout
from train.progress import Reporter

POINTER = "openft_checkpoint.json"

# Ray Train 2.60 reads these switches from the environment of the process that builds the trainer
# (this attempt task) and passes the second on to its controller: with state tracking on, runs are
# listed by name under the dashboard's Train tab (`/api/train/v2/runs/v1`), on a local Ray and on a
# cluster joined at RAY_ADDRESS alike (not through the Ray job's runtime_env: entrypoints/ray_runtime.py
# says why). The preemption watcher is off: it is an actor per run that polls Ray for node drains to
# mark workers that code could ask about, and nothing here asks (a lost worker is Ray Train's
# FailureConfig's, below); a minimal run cost 12.1 CPU-s without it against 13.8 with it (3 runs each).
RAY_TRAIN_ENV = {"RAY_TRAIN_ENABLE_STATE_TRACKING": "1", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def _report_pointer(key: str | None) -> None:
    """Every rank reports (Ray Train's report is collective); rank 0's carries the pointer, the others' None."""
    import ray.train

    if key is None:
        ray.train.report({"checkpoint_key": None})
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / POINTER).write_text(json.dumps({"key": key}))
        ray.train.report({"checkpoint_key": key}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def _rows(job: TrainJob, name: str, prefix: str) -> list[dict]:
    import ray.train

    from pipelines.tokenize import read_tokenized
    from storage.objects import open_object_store

    if not job.ray_data_reads:
        return read_tokenized(open_object_store(*job.store_spec), prefix)
    shard = ray.train.get_dataset_shard(name)
    return sorted(shard.iter_rows(), key=lambda r: r["line"]) if shard is not None else []


def _plain(row: dict) -> dict:
    # Ray Data hands list columns over as numpy arrays; the recipes take lists of ints.
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in row.items()}


def train_worker(config: dict) -> dict | None:
    """The per-worker loop, on every rank. Rank 0 returns the outcome as a dict, the others None."""
    import ray.train

    from train.dpo import train_dpo
    from train.rft import train_rft
    from train.sft import train_sft

    from ray.util import get_current_placement_group

    from storage import keys
    from storage.objects import open_object_store
    from train.checkpoint import latest_checkpoint
    from train.parallel import Group
    from train.progress import Silent

    job: TrainJob = config["job"]
    group = Group.of_ray_train_worker()
    reporter: Reporter = config["reporter_factory"]() if group.leader else Silent()
    record = getattr(reporter, "placement_group", None)
    pg = get_current_placement_group()
    if record is not None and pg is not None:
        record(pg.id.hex())
    # A worker Ray Train restarted finds the mark its first life left: it resumes from the newest
    # checkpoint in the store, whether or not Ray Train had registered that checkpoint's pointer
    # when the worker died (a worker killed right after saving leaves the store ahead of Ray Train).
    # Rank 0 decides for every rank: another rank's look at the store could see rank 0's fresh mark.
    store = open_object_store(*job.store_spec)
    restarted = 0
    if group.leader:
        mark = keys.worker_mark(job.job_id, job.run_name)
        restarted = int(ray.train.get_checkpoint() is not None or store.exists(mark))
        if not restarted:
            store.put_bytes(mark, b"")
    if group.from_rank0(restarted):
        resume = job.resume or latest_checkpoint(store, job.checkpoint_prefix) is not None
        reporter.event("Worker lost, retrying from checkpoint." if resume else "Worker lost, retrying from the start.",
                       level="warning")
        job = dataclasses.replace(job, resume=resume)
    train_rows = [_plain(r) for r in _rows(job, "train", job.train_prefix)]
    if job.eval_source == "validation_file":
        eval_rows = [_plain(r) for r in _rows(job, "eval", job.eval_prefix)]
    else:
        train_rows, eval_rows = split_holdout(train_rows, config["file_rows"], job.seed)
    recipe = {"supervised": train_sft, "dpo": train_dpo, "reinforcement": train_rft}[job.method_type]
    try:
        outcome = recipe(job, reporter, train_rows, eval_rows, on_checkpoint=_report_pointer, group=group)
    except TrainingError as exc:
        reporter.event(exc.message, level="error", data={"code": exc.code})
        outcome = TrainOutcome("failed", error=exc)
    if not group.leader:
        return None
    error = {"code": outcome.error.code, "message": outcome.error.message} if outcome.error else None
    return {"status": outcome.status, "result": outcome.result, "error": error}


def run_training(
    job: TrainJob,
    reporter_factory: Callable[[], Reporter],
    *,
    num_workers: int = 1,
    use_gpu: bool = False,
    resources_per_worker: dict | None = None,
) -> TrainOutcome:
    """Train `job` on `num_workers` Ray Train workers (data parallel) and wait for it. Ray must be
    initialised. Whether the cluster can place the workers is checked when the service starts
    (entrypoints/preflight.py `check_cluster`), not here, after tokenizing.

    `reporter_factory` is called inside the worker, so it must pickle. Ray Train's own run state
    (its pointer checkpoints) lives in the job's store under `keys.train_runs`: every node reaches
    it (a local directory would be the driver's alone), and the reaper deletes it with the job's copies.
    """
    import ray.train

    from pipelines.tokenize import load_ref, tokenized_dataset
    from storage import keys
    from storage.arrow import arrow_location
    from storage.objects import open_object_store

    os.environ.update(RAY_TRAIN_ENV)
    store = open_object_store(*job.store_spec)
    datasets = None
    if job.ray_data_reads:
        datasets = {"train": tokenized_dataset(job.store_spec, job.train_prefix, name=f"{job.job_id} train")}
        if job.eval_prefix is not None:
            datasets["eval"] = tokenized_dataset(job.store_spec, job.eval_prefix, name=f"{job.job_id} eval")
    file_rows = load_ref(store, job.train_prefix).report["rows"]
    storage_fs, storage_path = arrow_location(job.store_spec, keys.train_runs(job.job_id))
    trainer = trainer_class(num_workers)(
        train_worker,
        train_loop_config={"job": job, "reporter_factory": reporter_factory, "file_rows": file_rows},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources_per_worker, placement_strategy="SPREAD"),
        run_config=ray.train.RunConfig(
            name=job.run_name,
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            failure_config=ray.train.FailureConfig(max_failures=1),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
        ),
        datasets=datasets,
        dataset_config=ray.train.DataConfig(datasets_to_split=[]),
    )
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as exc:
        if worker_lost(exc):
            return TrainOutcome("failed", error=TrainingError(
                "platform_interrupted", "The worker running the job was lost twice and the job is not restarted."))
        # The worker's exception text is not passed on: it could quote a row.
        return TrainOutcome("failed", error=TrainingError("training_failed", f"Training failed twice ({_cause(exc)})."))
    out = result.return_value
    error = TrainingError(**out["error"]) if out["error"] else None
    return TrainOutcome(out["status"], out["result"], error)


def trainer_class(num_workers: int = 1):
    """Ray Train's `TorchTrainer` less two helper actors, each a process of its own per run:

    - the `DatasetManager` of its datasets callback, for a run given no datasets (a job's rows read
      from the store, as every job below `TrainJob.ray_data_reads`'s size is): Ray Train 2.60 starts
      one for every run, a process importing Ray Data that such a run never asks for a shard;
    - the `PlacementGroupCleaner`, a detached actor per run that removes the run's placement group
      if Ray Train's controller dies: the job controller's sweep does that for every run, whatever
      stopped it (train/placement.py `remove_orphans`, every `controller_sweep_seconds`).

    A one-worker run takes Ray Train's `DataParallelTrainer` with its plain `BackendConfig` instead:
    it does no collective (train/parallel.py `SINGLE`), so it needs no torch process group, and its
    Ray Train controller, a process of its own per run that unpickles the run's backend config, then
    never imports torch (`TorchConfig` does). On GPU the worker's one device is still the one Ray
    assigned it (CUDA_VISIBLE_DEVICES). bench/train_start.py measures a minimal run against
    the stock TorchTrainer."""
    from ray.train.v2._internal.callbacks import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    if num_workers > 1:
        from ray.train.torch import TorchTrainer as Base
    else:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer as Base

    class Trainer(Base):
        def _create_default_callbacks(self):
            dropped = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
            return [callback for callback in super()._create_default_callbacks() if not isinstance(callback, dropped)]

    return Trainer


def worker_lost(exc: BaseException) -> bool:
    """Whether Ray Train gave up because a worker process or its node died (not because the
    training code raised): the reference's `platform_interrupted`."""
    from ray.exceptions import ActorDiedError, NodeDiedError, RayActorError, WorkerCrashedError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckTimeoutError

    lost = (RayActorError, ActorDiedError, WorkerCrashedError, NodeDiedError, WorkerHealthCheckTimeoutError)
    failures = list(getattr(exc, "worker_failures", {}).values())
    if not failures and getattr(exc, "controller_failure", None) is not None:
        failures = [exc.controller_failure]
    for failure in failures or [exc]:
        cause = failure
        while cause is not None:
            if isinstance(cause, lost):
                return True
            # A dead worker reaches the controller as a failed health check wrapping the actor's death.
            cause = getattr(cause, "health_check_failure", None) or cause.__cause__
    return False


def _cause(exc: BaseException) -> str:
    cause = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    return type(cause).__name__
