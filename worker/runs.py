"""The worker's supervision of training runs: the pass that starts them and the thread that drives
each one to its end.

Where it sits: worker/controller.py's tick calls `RunWork.reconcile` and `RunWork.claim`; the pass is
jobs/scheduling.py's (reconcile lost runs, expire waits, start runs under the cap and the
cluster's capacity), and each started run is driven on a thread of its own (`drive`).

A run's thread holds the job's lease for its whole life, renewed by its heartbeat
(storage/leases.py): it launches the attempt as a Ray task (train/attempt.py) and supervises it,
stopping the task when the lease is no longer its own, when the job's time limit has run out
(counted from the run's start, over every attempt), or when the run has written nothing for
`run_stall_seconds`. Then it runs the serving-parity check (train/parity.py, a Ray task) and
records the end: the success transaction (jobs/registration.py `succeed`: the adapter registered,
the job succeeded) or the run's end (jobs/transitions.py), each a compare-and-set that proves the
lease. Every write rides through a database outage for `db_outage_seconds`; past that the thread
gives up and the lease, no longer renewed, hands the job to reconciliation: never `running` with
nothing driving it. Each pass also removes the placement groups of stopped runs that Ray would
keep (train/placement.py).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from catalog.bases import get_base
from jobs import scheduling, transitions
from jobs.registration import succeed
from jobs.model_names import resolve_model
from jobs.reinforcement import grader_model_names
from jobs.spec import JobSpec
from openft import metrics
from storage import files as files_repo
from storage import jobs as jobs_repo
from storage import keys, leases
from storage.leases import Heartbeat, LeaseLost
from storage.models import Job
from train.attempt import AttemptResult, FileRef, RayRuns, RunTicket
from train.config import GraderModel
from train.integrations.forwarder import follow as follow_integrations
from train.parity import ParityAbandoned, check_parity, parity_error, parity_request
from train.placement import remove_orphans, remove_placement_group
from worker.work import Task

log = logging.getLogger("openft.controller")
STOP_GRACE_S = 30  # past the deadline, the run's own time check has had this long to fail it cleanly


def grader_models(session, account_id: str, grader: dict) -> tuple[GraderModel, ...]:
    """A reinforcement job's model graders' models as its trainer needs them (it reads no database),
    resolved when the run starts; one deleted since create is left out, and its grades fail (0, counted)."""
    found = [(name, resolve_model(session, account_id, name)) for name in sorted(set(grader_model_names(grader)))]
    return tuple(GraderModel(name, m.base_id, m.adapter_prefix) for name, m in found if m is not None and m.servable)


class RunWork:
    kind = transitions.RUN

    def __init__(self, ctl, executor=None):
        self.ctl = ctl
        self.executor = executor or RayRuns()

    @property
    def settings(self):
        return self.ctl.settings

    # -- the pass ----------------------------------------------------------------------------------
    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]:
        """Requeue (or fail) every run that nothing drives any more, and free what those runs had
        reserved on the cluster."""
        lost = scheduling.reconcile(self.ctl.db, now, alive=alive, mine=mine)
        for run in lost:
            remove_placement_group(run.placement_group)
        return [run.job_id for run in lost]

    def sweep(self, now: int) -> None:
        try:
            remove_orphans()  # the groups of runs stopped before their worker recorded them (train/placement.py)
        except Exception as exc:  # the GCS is briefly unreachable: the next sweep tries again
            log.warning("placement group sweep failed: %s", type(exc).__name__)

    def claim(self, now: int) -> list[Task]:
        scheduling.expire_waiting(self.ctl.db, now, self.settings.capacity_wait_limit_seconds)
        started = scheduling.start_runs(self.ctl.db, now, settings=self.settings, fit=self._fit,
                                        new_owner=lambda: leases.new_owner(self.ctl.id, self.kind))
        return [Task(run.job_id, run.owner, partial(self.drive, run)) for run in started]

    def _fit(self, session) -> float:
        """Runs the cluster holds beside the batches leased now (the scheduler's lock is held)."""
        import ray

        need = scheduling.run_need(self.settings)
        taken = scheduling.held(session, self.settings, runs=False)
        return scheduling.free_for(ray.cluster_resources(), scheduling.data_reserve(self.settings, need), taken, need)

    # -- one run -----------------------------------------------------------------------------------
    def heartbeat(self, run: scheduling.Started) -> Heartbeat:
        """The run's lease renewed for as long as its thread drives it; `seen` is when the run last wrote."""
        return Heartbeat(self.ctl.db, self.kind, run.job_id, run.owner, self.settings.run_lease_seconds,
                         read=lambda session: transitions.progress(session, run.job_id), stopping=self.ctl.stopping)

    def drive(self, run: scheduling.Started) -> None:
        with self.heartbeat(run) as beat:
            try:
                ticket = self._ticket(run)
                follow_integrations(self.settings, run.job_id, ticket.spec)  # wandb/mlflow, in an actor of their own
                result = self._supervise(run, ticket, beat)
                self.conclude(run, ticket.spec.method_type, result, beat)
            except LeaseLost:
                log.info("run %s of %s stopped: its lease is held by another run", run.owner, run.job_id)
            except Exception as exc:
                log.error("run of %s failed: %s", run.job_id, type(exc).__name__)
                try:
                    self._end(run, AttemptResult("failed", error_code="training_failed",
                                                 error_message="Training failed for another reason."))
                except Exception as again:  # the lease lapses and reconciliation takes the job
                    log.error("run of %s could not record its end: %s", run.job_id, type(again).__name__)

    def _write(self, work, what: str):
        return self.ctl.ctx.retrying(work, what)

    def _ticket(self, run: scheduling.Started) -> RunTicket:
        def read():
            with self.ctl.db.session() as session:
                job = session.get(Job, run.job_id)
                if job is None or job.lease_owner != run.owner:
                    raise LeaseLost()
                files = {f.id: FileRef(f.object_key, f.sha256) for f in files_repo.files_by_id(
                    session, [job.training_file, job.validation_file]).values()}
                budget = self.settings.job_time_limit_seconds - (job.run_seconds or 0.0)
                spec = JobSpec.from_record(job.spec)
                return RunTicket(
                    job_id=job.id, owner=run.owner, attempt=run.attempt, spec=spec,
                    training=files[job.training_file],
                    validation=files[job.validation_file] if job.validation_file else None,
                    settings=self.settings, deadline=(job.run_started_at or time.time()) + budget,
                    resume=any(True for _ in self.ctl.store.list(keys.checkpoints(job.id))),
                    grader_models=grader_models(session, job.account_id, spec.grader) if spec.grader else (),
                )

        return self._write(read, "read the run")

    def _supervise(self, run: scheduling.Started, ticket: RunTicket, beat: Heartbeat) -> AttemptResult:
        settings = self.settings
        handle = self.executor.launch(ticket)
        progress = time.time()
        while True:
            result = handle.wait(timeout=1.0)
            if result is not None:
                return result
            now = time.time()
            if not beat.holding():  # another run holds the job, or this worker is stopping: the
                self._abort(run, handle)  # next worker's reconcile takes it
                raise LeaseLost()
            progress = max(progress, beat.seen or 0)
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
        with self.ctl.db.session() as session:
            pg = jobs_repo.placement_group(session, run.job_id, run.owner)
        remove_placement_group(pg)

    def conclude(self, run: scheduling.Started, method_type: str, result: AttemptResult,
                 beat: Heartbeat | None = None) -> None:
        """Record how a run ended: register its adapter, or its failure, pause or cancel. Raises
        LeaseLost when the run no longer owns the job (then nothing is written). Without `beat`
        (the run's thread passes its own), the lease is renewed here while it runs."""
        if beat is None:
            with self.heartbeat(run) as beat:
                return self.conclude(run, method_type, result, beat)
        if result.status != "succeeded":
            self._end(run, result)
            return
        now = int(time.time())

        def begin():
            with self.ctl.db.session() as session:
                return transitions.begin_registering(session, run.job_id, run.owner, now)

        moved = self._write(begin, "begin registering")
        if not moved.ok:
            if moved.status is None:
                raise LeaseLost()
            return  # cancelled or paused while the last step ran: register nothing
        parity = self._parity(run, beat) if self.settings.parity_check else None

        def record():
            with self.ctl.db.session() as session:
                return succeed(session, self.ctl.store, self.settings, run.job_id, run.owner, now,
                               result={**(result.result or {}), "loss_mask": result.loss_mask},
                               trained_tokens=(result.result or {}).get("trained_tokens"), method_type=method_type,
                               parity=parity)

        figures = self._write(record, "register")
        if figures:  # recorded once the registration is committed, not in a try the write may repeat
            metrics.record_run(model=figures.model, first_step_s=figures.first_step_s,
                               trained_tokens=figures.trained_tokens, loop_s=(result.result or {}).get("seconds"))

    def _parity(self, run: scheduling.Started, beat: Heartbeat) -> dict | None:
        """The serving-parity check's figures (train/parity.py), run as a Ray task while the run's
        heartbeat keeps its lease; None for a download-only base (nothing to serve)."""

        def read():
            with self.ctl.db.session() as session:
                job = session.get(Job, run.job_id)
                if job is None or job.lease_owner != run.owner:
                    raise LeaseLost()
                if not get_base(job.model).servable:
                    return None
                found = {f.id: f.object_key for f in files_repo.files_by_id(
                    session, [job.training_file, job.validation_file]).values()}
                return parity_request(job, found.get(job.validation_file or ""), found[job.training_file],
                                      keys.adapter(job.id), self.settings, self.ctl.store.spec())

        try:
            request = self._write(read, "read the parity inputs")
        except LeaseLost:
            raise
        except Exception as exc:  # e.g. its file row is gone: the check cannot run, the job still succeeds
            return parity_error(type(exc).__name__, 0.0)
        if request is None:
            return None
        try:
            return check_parity(request, resources=dict(self.settings.batch_engine_resources),
                                timeout_s=self.settings.parity_timeout_seconds, keep_going=beat.holding)
        except ParityAbandoned:
            raise LeaseLost() from None

    def _end(self, run: scheduling.Started, result: AttemptResult) -> None:
        """Record a run that stopped without an adapter to register."""
        now = int(time.time())

        def work():
            with self.ctl.db.session() as session:
                if result.status == "lost":
                    return transitions.run_lost(session, run.job_id, run.owner, now)
                if result.status == "failed":
                    return transitions.run_failed(session, run.job_id, run.owner, now, result.error_code or
                                                  "training_failed", result.error_message or "Training failed.")
                return transitions.run_ended(session, run.job_id, run.owner, now, paused=result.status == "paused")

        if self._write(work, "end the run").status is None:
            raise LeaseLost()
