"""The worker: a Ray actor whose tick runs every kind of background work's pass, and cannot lose any.

Where it sits: the top floor beside the API. `openft serve` starts it (`start_controller`); it calls
down into each kind's package (jobs/, batches/, merge/, webhooks/) through one module per kind of
supervision (worker/runs.py, distills.py, batches.py, evals.py, merges.py) and never into serve_app/. It holds
no state a restart would lose: what it drives is what holds a lease in its name (storage/leases.py),
and a lease it stops renewing expires and is reconciled by whichever worker runs next.

A tick: first every kind reconciles its lost work (an expired lease, a thread of this worker that
died, a row in a status that needs a lease and has none), then every kind claims what may start
now, in the order of `Controller.work` (distills, runs, batches, eval runs, merges: a queued job's
run goes before a batch), and each claim is driven on a thread of its own under the lease's heartbeat.
A kind with no row either could act on (`leases.due_kinds`, one query for every kind) is skipped: an
idle service's tick is that query, not a dozen statements and five scheduler locks per kind pass.
Every `controller_sweep_seconds` a tick also sweeps what ended work left (each kind's `sweep`) and
sets the jobs gauge.
Webhook deliveries run on a thread of their own (webhooks/delivery.py), claimed under the same
leases.

Adding a kind of background work (an eval run, a reinforcement job): its package declares its
`Kind` and transitions (storage/leases.py says how); a module here implements worker/work.py's
`Work` (`reconcile`, and `claim` returning `Task`s whose `run` drives one claim under a
`Heartbeat`), as worker/merges.py does in some 50 lines; and it is added to `Controller.work`.
The tick, the threads, the alive set and the restart are this module's.

The actor restarts itself after a crash (`max_restarts=-1`) and starts its loop in `__init__`, so
a restarted actor schedules again at once; `openft serve` re-creates it if it is gone.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from batches import run as batch_run
from openft import metrics
from openft.head_node import HEAD_NODE_RESOURCES
from openft.settings import Settings
from storage import jobs as jobs_repo
from storage import leases
from storage.context import open_store
from storage.db import Database
from webhooks.delivery import start_deliverer
from worker.batches import BatchWork
from worker.distills import DistillWork
from worker.evals import EvalRunWork
from worker.merges import MergeWork
from worker.runs import RunWork
from worker.work import Work

log = logging.getLogger("openft.controller")
CONTROLLER_NAME = "openft-controller"


@dataclass(frozen=True)
class _Driving:
    kind: str
    row_id: str
    thread: threading.Thread


class Controller:
    def __init__(self, settings: Settings, *, runs=None, loop: bool = False):
        self.settings = settings
        self.ctx = batch_run.Context(settings, Database(settings.resolved_database_url()), open_store(settings))
        self.db, self.store, self.stopping = self.ctx.db, self.ctx.store, self.ctx.stopping
        self.id = f"ctl-{uuid.uuid4().hex[:12]}"
        self.runs_work = RunWork(self, runs)
        batches = BatchWork(self)
        # Eval runs sample on the batch engine: after the batches, under their capacity rule (`BatchWork.fit`).
        self.work: list[Work] = [DistillWork(self), self.runs_work, batches, EvalRunWork(self, batches.fit),
                                 MergeWork(self)]
        self.driving: dict[str, _Driving] = {}  # lease token -> what drives it
        self.swept_at = float("-inf")  # the first tick sweeps
        self.reconcile()
        if loop:
            threading.Thread(target=self.run_forever, name="controller-loop", daemon=True).start()
            start_deliverer(self.db, settings, f"{self.id}.w", self.stopping)  # webhooks: a thread of its own

    # -- the tick ---------------------------------------------------------------------------------
    def reconcile(self, kinds: set[str] | None = None) -> list[str]:
        """Lose, kind by kind (those named in `kinds`; None: every kind), the work nothing drives any
        more (this worker's dead threads' included); returns the ids of the rows lost."""
        self._reap_threads()
        now, alive = int(time.time()), self._alive()
        return [row_id for work in self.work if kinds is None or work.kind.name in kinds
                for row_id in work.reconcile(now, alive, self.id + ".")]

    def tick(self) -> list[str]:
        """One pass: the sweep when it is due, then, for each kind with a row due, reconcile and its
        claims, each driven on a thread; returns the ids of the rows it started."""
        if time.time() - self.swept_at >= self.settings.controller_sweep_seconds:
            self.sweep()
        with self.db.session() as session:
            due = leases.due_kinds(session, (work.kind for work in self.work))
        self.reconcile(due)
        started = []
        for work in self.work:
            if work.kind.name not in due:
                continue
            for task in work.claim(int(time.time())):
                thread = threading.Thread(target=task.run, name=f"{work.kind.name}-{task.row_id}", daemon=True)
                self.driving[task.owner] = _Driving(work.kind.name, task.row_id, thread)
                thread.start()
                started.append(task.row_id)
        return started

    def sweep(self) -> None:
        """What ended work left behind, kind by kind, and the jobs gauge."""
        self.swept_at = time.time()
        for work in self.work:
            work.sweep(int(self.swept_at))
        with self.db.session() as session:
            metrics.set_jobs_by_status(jobs_repo.count_by_status(session))

    def run_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception as exc:  # one failed pass must not stop scheduling; the next pass retries
                log.error("controller pass failed: %s", type(exc).__name__)
            self.stopping.wait(self.settings.controller_poll_seconds)

    def stop(self) -> None:
        """Stop claiming and renewing: every lease of this worker lapses and the next worker takes it."""
        self.stopping.set()

    # -- what it drives ---------------------------------------------------------------------------
    def driven(self, kind: str) -> dict[str, tuple[str, threading.Thread]]:
        """Row id -> (lease token, thread) of the work of `kind` started since the last reconcile."""
        return {d.row_id: (owner, d.thread) for owner, d in self.driving.items() if d.kind == kind}

    @property
    def runs(self) -> dict[str, tuple[str, threading.Thread]]:
        return self.driven("run")

    @property
    def distills(self) -> dict[str, tuple[str, threading.Thread]]:
        return self.driven("distill")

    @property
    def batches(self) -> dict[str, tuple[str, threading.Thread]]:
        return self.driven("batch")

    @property
    def executor(self):
        """What launches runs (train/attempt.py `RayRuns`; tests give scripted ones)."""
        return self.runs_work.executor

    @executor.setter
    def executor(self, runs) -> None:
        self.runs_work.executor = runs

    def active_runs(self) -> list[str]:
        self._reap_threads()
        return sorted(self.runs)

    def active_batches(self) -> list[str]:
        self._reap_threads()
        return sorted(self.batches)

    def controller_id(self) -> str:
        return self.id

    def _alive(self) -> set[str]:
        return {owner for owner, d in self.driving.items() if d.thread.is_alive()}

    def _reap_threads(self) -> None:
        for owner, d in list(self.driving.items()):
            if not d.thread.is_alive():
                self.driving.pop(owner, None)


def start_controller(settings: Settings, *, name: str = CONTROLLER_NAME):
    """Start the controller actor (it schedules from its constructor on); returns the handle.
    Ray restarts it after a crash, and a restarted one reconciles and schedules at once."""
    import ray

    actor_cls = ray.remote(num_cpus=0, resources=HEAD_NODE_RESOURCES, max_concurrency=16, max_restarts=-1)(Controller)
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
