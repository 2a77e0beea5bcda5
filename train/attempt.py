"""One run of a job (an attempt): tokenize its files, train, and say how it ended.

Where it sits: the worker's run supervision (worker/runs.py) builds a `RunTicket` from the job's row
when `jobs.scheduling.start_runs` has started it, and launches it through `RayRuns` as a Ray task;
the task runs `run_attempt` (tokenization, on Ray Data for large files; training on Ray Train through
train/launcher.py) and returns an `AttemptResult`. The controller registers the adapter itself.

Why a task: the controller must be able to stop a run at any point, whatever it is doing (a hung
step, a tokenization past the time limit, a trainer that never starts). Cancelling the task kills
its worker process, and with it the Ray Train controller and workers that it owns, so
`trainer.fit()` is bounded by the controller's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from jobs.spec import JobSpec
from openft.errors import TrainingError
from openft.settings import Settings
from storage import keys
from train.config import GraderModel, Reinforcement, TrainJob


@dataclass(frozen=True)
class FileRef:
    object_key: str
    sha256: str


@dataclass(frozen=True)
class RunTicket:
    """Everything a run needs, read from the database once when the run starts."""

    job_id: str
    owner: str  # the run's lease token: every write the run makes proves it still owns the job
    attempt: int
    spec: JobSpec
    training: FileRef
    validation: FileRef | None
    settings: Settings
    deadline: float  # unix seconds by which the job's time limit runs out
    resume: bool  # a checkpoint exists: continue from it
    grader_models: tuple[GraderModel, ...] = ()  # a reinforcement job's model graders' models, resolved

    @property
    def run_name(self) -> str:
        # Ray Train V2 reloads a reused run name's state: unique per attempt (a pause gives the
        # resumed run the same attempt number, hence the lease's suffix). The Train dashboard lists
        # runs by this name, so it starts with the job id.
        return f"{self.job_id}-attempt-{self.attempt}-{self.owner.rsplit('.', 1)[-1]}"


@dataclass(frozen=True)
class AttemptResult:
    # lost: the run's process or node died under it (a Ray system failure, not the job's fault)
    status: Literal["succeeded", "paused", "cancelled", "failed", "lost"]
    result: dict | None = None
    error_code: str | None = None
    error_message: str | None = None
    loss_mask: dict = field(default_factory=dict)


def run_attempt(ticket: RunTicket) -> AttemptResult:
    from catalog.bases import get_base
    from catalog.model_source import parse_model_source
    from pipelines.tokenize import build_tokenized
    from storage.db import Database
    from storage.objects import open_object_store
    from storage.tokenized_reaps import wait_while_marked
    from train.db_reporter import DBReporter
    from train.launcher import run_training

    settings, spec = ticket.settings, ticket.spec
    store = open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                              s3_region=settings.s3_region)
    db = Database(settings.resolved_database_url(), migrate=False)
    reporter = DBReporter(settings, ticket.job_id, ticket.owner)
    base = get_base(spec.model)
    source = parse_model_source(settings.model_source)

    def tokenized(ref: FileRef):
        wait_while_marked(db, ref.sha256)  # the reaper may be deleting these bytes' shards
        return build_tokenized(store.spec(), ref.object_key, ref.sha256, base.id, source, settings.model_cache_dir,
                               spec.max_seq_length, spec.method_type, name=f"{ticket.job_id} tokenize",
                               ray_threshold_bytes=settings.tokenize_ray_threshold_bytes)

    try:
        train_ref = tokenized(ticket.training)
        eval_ref = tokenized(ticket.validation) if ticket.validation else None
        stop = reporter.control()
        if stop in ("cancel", "lost"):
            return AttemptResult("cancelled")
        if stop == "pause":  # nothing trained yet: the resumed run starts from the last checkpoint, if any
            return AttemptResult("paused")
        reporter.event("Loss-mask report: what trains and what stays context.", data=train_ref.report)
        train_job = TrainJob(
            job_id=ticket.job_id, run_name=ticket.run_name, base_id=base.id, method_type=spec.method_type,
            adapter=spec.adapter, n_epochs=spec.n_epochs, batch_size=spec.batch_size,
            learning_rate=spec.learning_rate, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha,
            max_seq_length=spec.max_seq_length, beta=spec.beta, seed=spec.seed, model_source=settings.model_source,
            cache_root=str(settings.model_cache_dir), store_spec=store.spec(), train_prefix=train_ref.prefix,
            eval_prefix=eval_ref.prefix if eval_ref else None,
            eval_source="validation_file" if eval_ref else "holdout", output_prefix=keys.adapter(ticket.job_id),
            checkpoint_prefix=keys.checkpoints(ticket.job_id), resume=ticket.resume,
            device="cuda" if settings.train_use_gpu else "cpu", time_limit_s=settings.job_time_limit_seconds,
            deadline=ticket.deadline,
            ray_data_reads=any(store.size(ref.object_key) > settings.tokenize_ray_threshold_bytes
                               for ref in (ticket.training, ticket.validation) if ref),
            init_adapter_prefix=keys.parent_adapter(ticket.job_id) if spec.parent else None,
            reinforcement=reinforcement_settings(ticket, store.spec()) if spec.method_type == "reinforcement" else None,
        )
        outcome = run_training(
            train_job, partial(DBReporter, settings, ticket.job_id, ticket.owner),
            num_workers=settings.train_num_workers, use_gpu=settings.train_use_gpu,
            resources_per_worker=dict(settings.train_worker_resources),
        )
    except TrainingError as exc:
        return AttemptResult("failed", error_code=exc.code, error_message=exc.message)
    finally:
        db.dispose()
    if outcome.status == "failed":
        error = outcome.error or TrainingError("training_failed", "Training failed for another reason.")
        return AttemptResult("failed", error_code=error.code, error_message=error.message, loss_mask=train_ref.report)
    return AttemptResult(outcome.status, result=outcome.result, loss_mask=train_ref.report)


def reinforcement_settings(ticket: RunTicket, store_spec: tuple) -> Reinforcement:
    from catalog.bases import get_base
    from graders.sandbox import SandboxLimits
    from jobs.reinforcement import enable_thinking
    from pipelines.model_grading import GradingSetup

    spec, settings = ticket.spec, ticket.settings
    return Reinforcement(
        grader=spec.grader, samples_per_prompt=spec.samples_per_prompt, eval_interval=spec.eval_interval,
        eval_samples=spec.eval_samples, max_completion_tokens=spec.max_completion_tokens, temperature=spec.temperature,
        enable_thinking=enable_thinking(spec.reasoning_effort, get_base(spec.model)),
        sandbox=SandboxLimits.of(settings), grader_models=ticket.grader_models,
        grading=GradingSetup.of(settings, store_spec),
    )


class RayRun:
    """A launched attempt: poll it with `wait`, stop it with `abort`."""

    def __init__(self, ref):
        self.ref = ref

    def wait(self, timeout: float) -> AttemptResult | None:
        """The result once the task has ended, else None. A task whose code raised re-raises here;
        a task that Ray lost (its worker or node died, it was cancelled) ends `lost`."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        ready, _ = ray.wait([self.ref], timeout=timeout)
        if not ready:
            return None
        try:
            return ray.get(self.ref)
        except RayTaskError:
            raise
        except RayError:
            return AttemptResult("lost")

    def abort(self) -> None:
        import ray

        ray.cancel(self.ref, force=True)  # kills the task's worker, and the trainer it owns


class RayRuns:
    """Launches attempts as Ray tasks that take no CPU of their own (their workers hold the resources)."""

    def launch(self, ticket: RunTicket) -> RayRun:
        import ray

        task = ray.remote(num_cpus=0, max_retries=0)(run_attempt)
        return RayRun(task.options(name=f"{ticket.job_id} run a{ticket.attempt}").remote(ticket))
