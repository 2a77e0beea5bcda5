"""The job controller: a long-lived Ray actor that moves jobs from `queued` to their end.

It holds no state a restart would lose: each pass reads the DB, starts runs for queued jobs
(one per account, at most `max_concurrent_runs`, only when the cluster has a worker's resources
free), and a thread per run drives tokenization (Ray Data), training (Ray Train) and adapter
registration. On start it reconciles: a job the DB says is `running` but no run of this
controller drives was lost with its driver, so it is requeued once to resume from its last
checkpoint, then failed `platform_interrupted`.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial

from sqlalchemy import select

from catalog.bases import get_base
from catalog.model_source import parse_model_source
from merge.worker import run_pending_merges
from openft.settings import Settings
from storage import billing
from storage import jobs as jobs_repo
from storage.db import Database
from storage.job_lifecycle import finish, lock_account, promote_waiting
from storage.models import File, Job
from storage.objects import open_object_store
from train.config import TrainingError, TrainJob
from train.db_reporter import DBReporter
from train.registration import RegistrationError, register

log = logging.getLogger("openft.controller")
MAX_ATTEMPTS = 2  # the first run and one retry from the last checkpoint


def _error(code: str, message: str) -> dict:
    return {"code": code, "message": message, "param": None}


def _locked_job(session, job_id: str) -> Job | None:
    """The job's row under the locks the API's cancel takes (account, then job), so that checking its
    status and changing it is one step: on PostgreSQL a cancel could otherwise land in between and be
    overwritten (a cancelled job registered, or failed)."""
    account_id = session.scalar(select(Job.account_id).where(Job.id == job_id))
    if account_id is None:
        return None
    lock_account(session, account_id)
    return session.scalar(select(Job).where(Job.id == job_id).with_for_update())


class JobController:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.db = Database(settings.resolved_database_url())
        self.store = open_object_store(
            settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region
        )
        self.runs: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.reconcile()

    # -- passes ---------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Requeue (or fail) `running` jobs that no run of this controller drives."""
        now = int(time.time())
        touched = []
        with self.db.session() as session:
            for job in session.scalars(select(Job).where(Job.status == "running")):
                if job.id in self.runs:
                    continue
                touched.append(job.id)
                if job.attempts >= MAX_ATTEMPTS:
                    finish(session, job, "failed", now, error=_error(
                        "platform_interrupted", "The worker running the job was lost and the job is not restarted."))
                else:
                    job.status, job.updated_at = "queued", now
                    jobs_repo.add_event(session, job.id, now, "The run was lost with its controller; the job is "
                                        "queued again and resumes from its last checkpoint.", level="warn")
        return touched

    def tick(self) -> list[str]:
        """One scheduling pass; returns the ids of the jobs it started."""
        now = int(time.time())
        self._reap_threads()
        started = []
        with self.db.session() as session:
            self._expire_waiting(session, now)
            queued = session.scalars(select(Job).where(Job.status == "queued").order_by(Job.created_ns)).all()
            running_accounts = {
                j.account_id for j in session.scalars(select(Job).where(Job.status == "running")).all()
            }
            for job in queued:
                if len(self.runs) >= self.settings.max_concurrent_runs or not self._capacity():
                    if job.reason != "gridline_capacity":
                        job.reason = "gridline_capacity"
                        jobs_repo.add_event(session, job.id, now, "Waiting for a training worker to become free.")
                    continue
                if job.account_id in running_accounts or job.id in self.runs:
                    continue
                # Billing: hold the job's most before it runs, or fail it insufficient_quota (storage/billing.py).
                if self.settings.billing_enabled and not billing.hold_for_start(session, job, now):
                    continue
                job.status, job.reason, job.control, job.updated_at = "running", None, None, now
                job.started_at = job.started_at or now
                job.attempts += 1
                running_accounts.add(job.account_id)
                jobs_repo.add_event(session, job.id, now, "Fine-tuning job started.")
                started.append(job.id)
        for job_id in started:
            thread = threading.Thread(target=self._run_guarded, args=(job_id,), name=f"run-{job_id}", daemon=True)
            self.runs[job_id] = thread
            thread.start()
        run_pending_merges(self.settings, self.db, self.store, now=now, background=True)
        return started

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # one failed pass must not stop scheduling; the next pass retries
                log.error("controller pass failed: %s", type(exc).__name__)
            self._stop.wait(self.settings.controller_poll_seconds)

    def stop(self) -> None:
        self._stop.set()

    def active_runs(self) -> list[str]:
        self._reap_threads()
        return sorted(self.runs)

    # -- helpers --------------------------------------------------------------------------
    def _reap_threads(self) -> None:
        for job_id, thread in list(self.runs.items()):
            if not thread.is_alive():
                self.runs.pop(job_id, None)

    def _capacity(self) -> bool:
        import ray

        free = ray.available_resources()
        need = self.settings.train_worker_resources
        return all(free.get(k, 0.0) >= v * self.settings.train_num_workers for k, v in need.items())

    def _expire_waiting(self, session, now: int) -> None:
        limit = now - int(self.settings.capacity_wait_limit_seconds)
        stale = session.scalars(
            select(Job).where(Job.status.in_(("validating_files", "queued")), Job.created_at <= limit)
        ).all()
        for job in stale:
            finish(session, job, "failed", now, error=_error(
                "job_unavailable", "No capacity became free for this job within 24 hours. Nothing ran and nothing "
                "was charged."))
        for account_id in {j.account_id for j in stale}:
            promote_waiting(session, account_id, now)

    # -- one run --------------------------------------------------------------------------
    def _run_guarded(self, job_id: str) -> None:
        try:
            self._run(job_id)
        except TrainingError as exc:
            self._fail(job_id, exc.code, exc.message)
        except Exception as exc:
            log.error("job %s failed: %s", job_id, type(exc).__name__)
            self._fail(job_id, "training_failed", "Training failed for another reason.")

    def _fail(self, job_id: str, code: str, message: str) -> None:
        now = int(time.time())
        with self.db.session() as session:
            job = _locked_job(session, job_id)
            if job is not None and job.status not in jobs_repo.ENDED_STATUSES:
                job.control = None
                finish(session, job, "failed", now, error=_error(code, message))

    def _run(self, job_id: str) -> None:
        from pipelines.tokenize import build_tokenized
        from storage.tokenized_reaps import wait_while_marked
        from train.launcher import run_training

        settings = self.settings
        with self.db.session() as session:
            job = session.get(Job, job_id)
            spec, attempt = dict(job.spec), job.attempts
            files = {f.id: (f.object_key, f.sha256) for f in session.scalars(
                select(File).where(File.id.in_([job.training_file, job.validation_file or ""])))}
            training = files[job.training_file]
            validation = files.get(job.validation_file) if job.validation_file else None
        base = get_base(spec["model"])
        source = parse_model_source(settings.model_source)
        method = spec["method_type"]

        def tokenized(key_sha):
            wait_while_marked(self.db, key_sha[1])  # the reaper may be deleting these bytes' shards
            return build_tokenized(
                self.store.spec(), key_sha[0], key_sha[1], base.id, source, settings.model_cache_dir,
                spec["max_seq_length"], method,
            )

        train_ref = tokenized(training)
        eval_ref = tokenized(validation) if validation else None
        reporter = DBReporter(settings, job_id)
        reporter.event("Loss-mask report: what trains and what stays context.", data=train_ref.report)
        run_prefix = f"runs/{job_id}/"
        checkpoint_prefix = f"{run_prefix}checkpoints/"
        train_job = TrainJob(
            job_id=job_id, run_name=f"{job_id}-a{attempt}-{int(time.time())}", base_id=base.id,
            method_type=method, adapter=spec["adapter"], n_epochs=spec["n_epochs"], batch_size=spec["batch_size"],
            learning_rate=spec["learning_rate"], lora_rank=spec["lora_rank"], lora_alpha=spec["lora_alpha"],
            max_seq_length=spec["max_seq_length"], beta=spec.get("beta"), seed=spec["seed"],
            model_source=settings.model_source, cache_root=str(settings.model_cache_dir), store_spec=self.store.spec(),
            train_prefix=train_ref.prefix, eval_prefix=eval_ref.prefix if eval_ref else None,
            eval_source="validation_file" if eval_ref else "holdout", output_prefix=f"{run_prefix}adapter/",
            checkpoint_prefix=checkpoint_prefix, resume=any(True for _ in self.store.list(checkpoint_prefix)),
            device="cuda" if settings.train_use_gpu else "cpu", time_limit_s=settings.job_time_limit_seconds,
        )
        outcome = run_training(
            train_job, partial(DBReporter, settings, job_id), num_workers=settings.train_num_workers,
            use_gpu=settings.train_use_gpu, resources_per_worker=dict(settings.train_worker_resources),
            storage_path=str(settings.data_dir.resolve() / "train_runs"),
        )
        if outcome.status == "failed":
            raise outcome.error or TrainingError("training_failed", "Training failed for another reason.")
        if outcome.status != "succeeded":  # paused or cancelled: the API already set the status
            with self.db.session() as session:
                job = _locked_job(session, job_id)
                if job.control in ("pause", "cancel"):
                    job.control = None
                if outcome.status == "paused":
                    job.attempts -= 1  # a pause is not a lost run: the resumed run keeps its retry
                    if job.status == "paused":
                        jobs_repo.add_event(session, job_id, int(time.time()), "Checkpoint saved; job paused.")
            return
        self._register(job_id, outcome.result or {}, train_ref.report, f"{run_prefix}adapter")

    def _register(self, job_id: str, result: dict, report: dict, adapter_prefix: str) -> None:
        now = int(time.time())
        with self.db.session() as session:
            job = _locked_job(session, job_id)
            if job.status == "queued" and job.control is None:
                # Paused and resumed before the run saw the pause: the run never stopped, so its
                # finished adapter stands instead of a restart from the last checkpoint.
                job.status = "running"
            if job.status != "running":  # cancelled (or paused) while the last step ran: register nothing
                return
            job.control = "registering"
        metrics_rows = self._metrics_rows(job_id)
        with self.db.session() as session:
            job = session.get(Job, job_id)
            try:
                register(session, self.store, job, adapter_prefix=adapter_prefix, now=now, metrics_rows=metrics_rows,
                         retention_days=self.settings.file_retention_days,
                         default_models_limit=self.settings.models_per_account)
            except RegistrationError as exc:
                job.control = None
                job.result = {**result, "loss_mask": report}
                job.trained_tokens = result.get("trained_tokens")
                finish(session, job, "failed", now, error=_error(exc.code, exc.message))
                return
            job.control = None
            job.result = {**result, "loss_mask": report}
            job.trained_tokens = result.get("trained_tokens")
            jobs_repo.add_event(session, job_id, now, "Training finished.", type="metrics", data=job.result)
            finish(session, job, "succeeded", now, message="The job has successfully completed.")

    def _metrics_rows(self, job_id: str) -> list[dict]:
        with self.db.session() as session:
            rows, _ = jobs_repo.list_events(session, job_id, limit=100_000, after=None)
            out = []
            for event in reversed(rows):
                if event.type == "metrics" and event.data and "step" in event.data and "train_loss" in event.data:
                    out.append({"step": event.data["step"], "train_loss": event.data.get("train_loss"),
                                "train_accuracy": event.data.get("train_accuracy"),
                                "valid_loss": event.data.get("valid_loss"),
                                "valid_mean_token_accuracy": event.data.get("valid_mean_token_accuracy")})
            return out


def start_controller(settings: Settings, *, name: str = "openft-controller"):
    """Start the controller as a Ray actor running its scheduling loop; returns the handle."""
    import ray

    actor_cls = ray.remote(num_cpus=0, max_concurrency=16)(JobController)
    handle = actor_cls.options(name=name, get_if_exists=False).remote(settings)
    handle.run_forever.remote()
    return handle
