"""The job controller: a Ray actor that moves started jobs to their end and cannot lose one.

Where it sits: `openft serve` starts it (`start_controller`); each pass calls the database passes
in jobs/scheduling.py (reconcile lost runs, expire waits, start runs under the cap and the
cluster's capacity) and then drives every run it started on a thread of its own. It holds no state
a restart would lose: what it drives is what holds a lease in its name, and a lease it stops
renewing expires and is reconciled by whichever controller runs next.

A run's thread launches the attempt as a Ray task (train/attempt.py) and supervises it: it renews
the lease (the heartbeat), and stops the task when the lease is no longer its own, when the job's
time limit has run out (counted from the run's start, over every attempt), or when the run has
written nothing for `run_stall_seconds`. Then it runs the serving-parity check (train/parity.py, a
Ray task, the lease renewed meanwhile), registers the adapter (train/registration.py) with its
figures, or records the run's end, each a compare-and-set that proves the lease (jobs/transitions.py). Every
write rides through a database outage for `db_outage_seconds`; past that the thread gives up and
the lease, no longer renewed, hands the job to reconciliation: never `running` with nothing
driving it.

A job created on a batch results file (the distill shortcut) is distilled here too, on a thread
of its own under a distill lease (jobs/distilling.py): the thread renews the lease while
serve_app/services/distill.py `distill_job` distills, checks and admits the job. That function
lives with job create because it finishes create's checks; the controller only schedules it.

Batches (issue 13) are driven here too: each pass claims batches after it started runs
(batches/scheduling.py, under the capacity rule runs and batches share: jobs/scheduling.py) and
drives each on a thread of its own (batches/run.py `drive`), which holds the batch's lease.

The actor restarts itself after a crash (`max_restarts=-1`) and starts its loop in `__init__`, so
a restarted actor schedules again at once; `openft serve` re-creates it if it is gone. Each pass
also removes the placement groups of stopped runs that Ray would keep (train/placement.py).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from sqlalchemy import select

from batches import run as batch_run
from batches import scheduling as batch_scheduling
from catalog.bases import get_base
from jobs import distilling, scheduling, transitions
from jobs.spec import JobSpec
from merge.worker import run_pending_merges
from openft import metrics
from openft.head_node import HEAD_NODE_RESOURCES
from openft.settings import Settings
from serve_app.services.distill import distill_job
from serve_app.state import AppState
from storage import jobs as jobs_repo
from storage import keys
from storage.db import Database
from storage.models import File, Job
from storage.objects import open_object_store
from train.attempt import AttemptResult, FileRef, RayRuns, RunTicket
from train.integrations.forwarder import follow as follow_integrations
from train.parity import ParityAbandoned, check_parity, parity_error, parity_request
from train.placement import remove_orphans, remove_placement_group
from train.registration import RegistrationError, register
from webhooks.delivery import start_deliverer

log = logging.getLogger("openft.controller")
STOP_GRACE_S = 30  # past the deadline, the run's own time check has had this long to fail it cleanly


class LeaseLost(Exception):
    """The run's lease is held by another run now: stop and write nothing."""


class JobController:
    def __init__(self, settings: Settings, *, runs=None, loop: bool = False):
        self.settings = settings
        self.db = Database(settings.resolved_database_url())
        self.store = open_object_store(
            settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region
        )
        self.executor = runs or RayRuns()
        self.id = f"ctl-{uuid.uuid4().hex[:12]}"
        self.runs: dict[str, tuple[str, threading.Thread]] = {}  # job id -> (lease token, thread)
        self.distills: dict[str, tuple[str, threading.Thread]] = {}  # the same, for distill leases
        self.batches: dict[str, tuple[str, threading.Thread]] = {}  # the same, for batch leases
        self.batch_ctx = batch_run.Context(settings, self.db, self.store)
        self._stop = threading.Event()
        self.reconcile()
        if loop:
            threading.Thread(target=self.run_forever, name="controller-loop", daemon=True).start()
            start_deliverer(self.db, settings, f"{self.id}.w", self._stop)  # webhooks: a thread of its own

    # -- passes ---------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Requeue (or fail) every run that nothing drives any more, this controller's dead ones included,
        and free what those runs had reserved on the cluster."""
        self._reap_threads()
        lost = scheduling.reconcile(self.db, int(time.time()), alive=self._alive(), mine=self.id + ".")
        for run in lost:
            remove_placement_group(run.placement_group)
        try:
            remove_orphans()  # the groups of runs stopped before their worker recorded them (train/placement.py)
        except Exception as exc:  # the GCS is briefly unreachable: the next pass sweeps again
            log.warning("placement group sweep failed: %s", type(exc).__name__)
        batch_scheduling.reconcile(self.db, int(time.time()), alive=self._alive(), mine=self.id + ".")
        batch_run.sweep_stages(self.batch_ctx)  # the stages of batches that ended without their driver
        return [run.job_id for run in lost]

    def tick(self) -> list[str]:
        """One scheduling pass; returns the ids of the jobs it started."""
        now = int(time.time())
        self.reconcile()
        scheduling.expire_waiting(self.db, now, self.settings.capacity_wait_limit_seconds)
        for claim in scheduling.claim_distills(self.db, now, settings=self.settings,
                                               new_owner=lambda: f"{self.id}.d{uuid.uuid4().hex[:12]}"):
            thread = threading.Thread(target=self._distill, args=(claim,), name=f"distill-{claim.job_id}", daemon=True)
            self.distills[claim.job_id] = (claim.owner, thread)
            thread.start()
        started = scheduling.start_runs(self.db, now, settings=self.settings, fit=self._run_fit,
                                        new_owner=lambda: f"{self.id}.{uuid.uuid4().hex[:12]}")
        for run in started:
            thread = threading.Thread(target=self._drive, args=(run,), name=f"run-{run.job_id}", daemon=True)
            self.runs[run.job_id] = (run.owner, thread)
            thread.start()
        for claim in batch_scheduling.claim_batches(self.db, now, settings=self.settings, fit=self._batch_fit,
                                                    new_owner=lambda: f"{self.id}.b{uuid.uuid4().hex[:12]}"):
            thread = threading.Thread(target=batch_run.drive, args=(self.batch_ctx, claim), name=f"batch-{claim.batch_id}",
                                      daemon=True)
            self.batches[claim.batch_id] = (claim.owner, thread)
            thread.start()
        run_pending_merges(self.settings, self.db, self.store, now=now, background=True)
        with self.db.session() as session:
            metrics.set_jobs_by_status(jobs_repo.count_by_status(session))
        return [run.job_id for run in started]

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # one failed pass must not stop scheduling; the next pass retries
                log.error("controller pass failed: %s", type(exc).__name__)
            self._stop.wait(self.settings.controller_poll_seconds)

    def stop(self) -> None:
        self._stop.set()
        self.batch_ctx.stopping.set()

    def active_batches(self) -> list[str]:
        self._reap_threads()
        return sorted(self.batches)

    def active_runs(self) -> list[str]:
        self._reap_threads()
        return sorted(self.runs)

    def controller_id(self) -> str:
        return self.id

    # -- helpers --------------------------------------------------------------------------
    def _alive(self) -> set[str]:
        threads = [*self.runs.values(), *self.distills.values(), *self.batches.values()]
        return {owner for owner, thread in threads if thread.is_alive()}

    def _reap_threads(self) -> None:
        for threads in (self.runs, self.distills, self.batches):
            for job_id, (_, thread) in list(threads.items()):
                if not thread.is_alive():
                    threads.pop(job_id, None)

    def _fit(self) -> float:
        """Runs the cluster holds at once: its total resources, less the CPUs kept for Ray Data."""
        import ray

        need = scheduling.run_need(self.settings)
        return scheduling.runs_that_fit(ray.cluster_resources(), need, scheduling.data_reserve(self.settings, need))

    def _run_fit(self, session) -> float:
        """Runs the cluster holds beside the batches leased now (the scheduler's lock is held)."""
        import ray

        need = scheduling.run_need(self.settings)
        taken = scheduling.held(session, self.settings, runs=False)
        return scheduling.free_for(ray.cluster_resources(), scheduling.data_reserve(self.settings, need), taken, need)

    def _batch_fit(self, session) -> float:
        """More batches the cluster holds beside the leased runs and batches."""
        import ray

        need = scheduling.batch_need(self.settings)
        taken = scheduling.held(session, self.settings)
        return scheduling.free_for(ray.cluster_resources(), scheduling.data_reserve(self.settings, need), taken, need)

    def _write(self, work, what: str):
        return self.db.retrying(work, budget_s=self.settings.db_outage_seconds, what=what)

    # -- one distillation -----------------------------------------------------------------
    def _distill(self, claim: scheduling.Started) -> None:
        """Distill one job while a heartbeat renews the lease; a stopping controller stops renewing,
        so the lease lapses and the next controller distills the job again."""
        done = threading.Event()

        def heartbeat():
            every = max(self.settings.run_lease_seconds / 3, 0.2)
            while not done.wait(every) and not self._stop.is_set():
                try:
                    if self._renew(claim, int(time.time())) is None:
                        return  # cancelled: distill_job finds the lease gone and records nothing
                except Exception as exc:  # the database is down: renew when it is back
                    log.warning("distill lease renewal of %s failed: %s", claim.job_id, type(exc).__name__)

        beat = threading.Thread(target=heartbeat, name=f"distill-beat-{claim.job_id}", daemon=True)
        beat.start()
        try:
            distill_job(AppState(self.settings, self.db, self.store), claim.job_id, claim.owner)
        except Exception as exc:
            log.error("distillation of %s failed: %s", claim.job_id, type(exc).__name__)

            def fail():
                with self.db.session() as session:
                    distilling.failed(session, claim.job_id, claim.owner, int(time.time()), code="distill_failed",
                                      message="Distilling training_file failed for another reason. Create the job "
                                      "again, or call POST /v1/files/distill and create it on the files it makes.",
                                      param="training_file")

            try:
                self._write(fail, "fail the distillation")
            except Exception as again:  # the lease lapses and the next pass distills the job again
                log.error("distillation of %s could not record its end: %s", claim.job_id, type(again).__name__)
        finally:
            done.set()

    # -- one run --------------------------------------------------------------------------
    def _drive(self, run: scheduling.Started) -> None:
        try:
            ticket = self._ticket(run)
            follow_integrations(self.settings, run.job_id, ticket.spec)  # wandb/mlflow, in an actor of their own
            result = self._supervise(run, ticket)
            self.conclude(run, ticket.spec.method_type, result)
        except LeaseLost:
            log.info("run %s of %s stopped: its lease is held by another run", run.owner, run.job_id)
        except Exception as exc:
            log.error("run of %s failed: %s", run.job_id, type(exc).__name__)
            try:
                self._end(run, AttemptResult("failed", error_code="training_failed",
                                             error_message="Training failed for another reason."))
            except Exception as again:  # the lease lapses and reconciliation takes the job
                log.error("run of %s could not record its end: %s", run.job_id, type(again).__name__)

    def _ticket(self, run: scheduling.Started) -> RunTicket:
        def read():
            with self.db.session() as session:
                job = session.get(Job, run.job_id)
                if job is None or job.lease_owner != run.owner:
                    raise LeaseLost()
                files = {f.id: FileRef(f.object_key, f.sha256) for f in session.scalars(
                    select(File).where(File.id.in_([job.training_file, job.validation_file or ""])))}
                budget = self.settings.job_time_limit_seconds - (job.run_seconds or 0.0)
                return RunTicket(
                    job_id=job.id, owner=run.owner, attempt=run.attempt, spec=JobSpec.from_record(job.spec),
                    training=files[job.training_file],
                    validation=files[job.validation_file] if job.validation_file else None,
                    settings=self.settings, deadline=(job.run_started_at or time.time()) + budget,
                    resume=any(True for _ in self.store.list(keys.checkpoints(job.id))),
                )

        return self._write(read, "read the run")

    def _supervise(self, run: scheduling.Started, ticket: RunTicket) -> AttemptResult:
        settings = self.settings
        handle = self.executor.launch(ticket)
        renew_every = max(settings.run_lease_seconds / 3, 0.2)
        renewed = progress = time.time()
        while True:
            result = handle.wait(timeout=min(renew_every, 1.0))
            if result is not None:
                return result
            now = time.time()
            if self._stop.is_set():
                self._abort(run, handle)
                raise LeaseLost()  # a stopping controller leaves the job to the next one's reconcile
            if now - renewed >= renew_every:
                try:
                    seen = self._renew(run, int(now))
                except Exception as exc:  # the database is down: keep training, renew when it is back
                    log.warning("lease renewal of %s failed: %s", run.job_id, type(exc).__name__)
                else:
                    if seen is None:
                        self._abort(run, handle)
                        raise LeaseLost()
                    renewed, progress = now, max(progress, seen)
            if now > ticket.deadline + min(STOP_GRACE_S, max(1.0, 0.1 * settings.job_time_limit_seconds)):
                self._abort(run, handle)
                return AttemptResult("failed", error_code="time_limit_exceeded", error_message=(
                    f"The job did not finish within its {settings.job_time_limit_seconds:.0f} s time limit, counted "
                    "from the start of each run; the run was stopped."))
            if now - progress > settings.run_stall_seconds:
                self._abort(run, handle)
                return AttemptResult("failed", error_code="training_failed", error_message=(
                    f"The run made no progress for {settings.run_stall_seconds:.0f} s and was stopped."))

    def _abort(self, run: scheduling.Started, handle) -> None:
        """Stop the run's task, and free its Train workers' placement group: Ray Train removes it
        itself only when its own controller ends cleanly."""
        handle.abort()
        with self.db.session() as session:
            pg = session.scalar(select(Job.run_placement_group).where(Job.id == run.job_id, Job.lease_owner == run.owner))
        remove_placement_group(pg)

    def _renew(self, run: scheduling.Started, now: int) -> int | None:
        with self.db.session() as session:
            return transitions.renew(session, run.job_id, run.owner, now, int(self.settings.run_lease_seconds))

    def conclude(self, run: scheduling.Started, method_type: str, result: AttemptResult) -> None:
        """Record how a run ended: register its adapter, or its failure, pause or cancel. Raises
        LeaseLost when the run no longer owns the job (then nothing is written)."""
        if result.status != "succeeded":
            self._end(run, result)
            return
        now = int(time.time())

        def begin():
            with self.db.session() as session:
                return transitions.begin_registering(session, run.job_id, run.owner, now)

        moved = self._write(begin, "begin registering")
        if not moved.ok:
            if moved.status is None:
                raise LeaseLost()
            return  # cancelled or paused while the last step ran: register nothing
        parity = self._parity(run) if self.settings.parity_check else None
        metrics_rows = self._write(lambda: self._metrics_rows(run.job_id), "read metrics")
        result_row = {**(result.result or {}), "loss_mask": result.loss_mask}

        def finish():
            with self.db.session() as session:
                job = transitions.owned(session, run.job_id, run.owner)
                if job is None:
                    raise LeaseLost()
                job.result = result_row
                job.trained_tokens = (result.result or {}).get("trained_tokens")
                try:
                    register(session, self.store, job, method_type=method_type, adapter_prefix=keys.adapter(job.id).rstrip("/"), now=now,
                             metrics_rows=metrics_rows, retention_days=self.settings.file_retention_days,
                             default_models_limit=self.settings.models_per_account, parity=parity)
                except RegistrationError as exc:
                    transitions.run_refused(session, job, run.owner, now, exc.code, exc.message)
                    return
                first_step_s = jobs_repo.first_step_seconds(session, job.id)
                jobs_repo.add_event(session, job.id, now, "Training finished.", type="metrics", data=job.result)
                transitions.run_succeeded(session, job, run.owner, now)
                return job.model, first_step_s, job.trained_tokens

        figures = self._write(finish, "register")
        if figures:  # recorded once the registration is committed, not in a try the write may repeat
            metrics.record_run(model=figures[0], first_step_s=figures[1], trained_tokens=figures[2],
                               loop_s=(result.result or {}).get("seconds"))

    def _parity(self, run: scheduling.Started) -> dict | None:
        """The serving-parity check's figures (train/parity.py), run as a Ray task while this thread
        keeps renewing the lease; None for a download-only base (nothing to serve)."""

        def read():
            with self.db.session() as session:
                job = session.get(Job, run.job_id)
                if job is None or job.lease_owner != run.owner:
                    raise LeaseLost()
                if not get_base(job.model).servable:
                    return None
                found = {f.id: f.object_key for f in session.scalars(
                    select(File).where(File.id.in_([job.training_file, job.validation_file or ""])))}
                return parity_request(job, found.get(job.validation_file or ""), found[job.training_file],
                                      keys.adapter(job.id), self.settings, self.store.spec())

        try:
            request = self._write(read, "read the parity inputs")
        except LeaseLost:
            raise
        except Exception as exc:  # e.g. its file row is gone: the check cannot run, the job still succeeds
            return parity_error(type(exc).__name__, 0.0)
        if request is None:
            return None
        every, renewed = max(self.settings.run_lease_seconds / 3, 0.2), time.time()

        def keep_going() -> bool:
            nonlocal renewed
            if self._stop.is_set():
                return False
            if time.time() - renewed < every:
                return True
            try:
                held = self._renew(run, int(time.time())) is not None
            except Exception as exc:  # the database is down: keep checking; `finish` proves the lease
                log.warning("lease renewal of %s failed: %s", run.job_id, type(exc).__name__)
                return True
            renewed = time.time()
            return held

        try:
            return check_parity(request, resources=dict(self.settings.batch_engine_resources),
                                timeout_s=self.settings.parity_timeout_seconds, keep_going=keep_going)
        except ParityAbandoned:
            raise LeaseLost() from None

    def _end(self, run: scheduling.Started, result: AttemptResult) -> None:
        """Record a run that stopped without an adapter to register."""
        now = int(time.time())

        def work():
            with self.db.session() as session:
                if result.status == "lost":
                    return transitions.run_lost(session, run.job_id, run.owner, now)
                if result.status == "failed":
                    return transitions.run_failed(session, run.job_id, run.owner, now, result.error_code or
                                                  "training_failed", result.error_message or "Training failed.")
                return transitions.run_ended(session, run.job_id, run.owner, now, paused=result.status == "paused")

        if self._write(work, "end the run").status is None:
            raise LeaseLost()

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


CONTROLLER_NAME = "openft-controller"


def start_controller(settings: Settings, *, name: str = CONTROLLER_NAME):
    """Start the controller actor (it schedules from its constructor on); returns the handle.
    Ray restarts it after a crash, and a restarted one reconciles and schedules at once."""
    import ray

    actor_cls = ray.remote(num_cpus=0, resources=HEAD_NODE_RESOURCES, max_concurrency=16, max_restarts=-1)(JobController)
    return actor_cls.options(name=name, get_if_exists=False).remote(settings, loop=True)


def ensure_controller(settings: Settings, current=None, *, name: str = CONTROLLER_NAME):
    """The controller actor, started if none by that name is alive (`openft serve` checks this
    periodically). Returns `current` while the actor lives: the creator's handle is what keeps a
    non-detached actor alive, so it is never swapped for a looked-up one."""
    import ray

    try:
        found = ray.get_actor(name)
    except ValueError:
        if current is not None:
            log.warning("the job controller is gone; starting a new one")
        return start_controller(settings, name=name)
    return current if current is not None else found
