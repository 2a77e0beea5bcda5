"""The job controller's passes over the database: reconcile lost runs, expire waits, start runs.

Where it sits: the worker's run and distill passes (worker/runs.py, worker/distills.py) call these
every pass (and own the Ray side: the runs' threads, the cluster's resources); each pass is made of
`jobs/transitions.py` compare-and-sets, so a pass that races an API request or another controller
changes nothing it should not.

- `reconcile`: every run whose lease has expired (its thread, driver or node died), every run of
  this controller whose thread is gone, and every `running` job with no lease at all is lost
  (storage/leases.py `reconcile`): queued again once from its last checkpoint, then
  `platform_interrupted` (`lose_run`). `reconcile_distills` does the same for distill leases.
- `expire_waiting`: a job that has waited past the limit since it entered its current wait fails
  (`expire_wait`: `job_unavailable` if it never ran, `job_expired` if it did).
- `claim_distills`: lease waiting distill-shortcut jobs (jobs/distilling.py) to this controller,
  at most `max_concurrent_distills` at once; the controller distills them on threads of its own.
- `start_runs`: under the scheduler's lock, start queued jobs, oldest first, one run per account,
  while the runs holding a lease stay under both `max_concurrent_runs` and what the cluster fits.
  Counting leases in the database (not Ray's free resources, which change only once a trainer has
  started) makes the cap hold within one pass and across passes and controllers.

Batches share the cluster with runs (issue 13): a batch's engine actors (`batch_need`) and a run's
Train workers (`run_need`) are counted from their leases against one total, after the CPUs kept
for Ray Data. `start_runs` takes `fit` as a function of its locked session, so the runs it starts
fit beside the batches leased at that moment; batches/scheduling.py `claim_batches` starts
batches only into what the leased runs and batches leave (`free_for`). So a batch never takes a
running job's workers and a job never oversubscribes the cluster with a batch. A pass starts runs
before it claims batches: a queued job goes first. Online serving's most (`online_need`: its
replicas at their maximum) is counted as held too, so serving never starves training (issue 27).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import func, select

from catalog.bases import served_bases
from jobs import distilling, transitions
from openft.settings import Settings
from storage import leases
from storage.db import Database
from storage.jobs import add_event
from storage.models import Job

CAPACITY_REASON = "gridline_capacity"


@dataclass(frozen=True)
class Started:
    job_id: str
    owner: str  # the lease token the run proves itself with
    attempt: int


def run_need(settings: Settings) -> dict[str, float]:
    """Ray resources one run takes: every Train worker's, and a GPU each when training on GPUs."""
    return {k: v * settings.train_num_workers for k, v in worker_bundle(settings).items()}


def worker_bundle(settings: Settings) -> dict[str, float]:
    """Ray resources one Train worker takes (a GPU when training on GPUs)."""
    bundle = {k: float(v) for k, v in settings.train_worker_resources.items()}
    if settings.train_use_gpu:
        bundle["GPU"] = max(bundle.get("GPU", 0.0), 1.0)
    return {k: v for k, v in bundle.items() if v > 0}


def placement_problem(settings: Settings, nodes: list[dict[str, float]]) -> str | None:
    """Why the cluster whose alive nodes hold `nodes` (each node's total resources) can never run a
    job's `train_num_workers` workers, or None. Each worker's bundle must fit on one node (SPREAD
    falls back to packing several on a node), and the run must fit beside the CPUs kept for Ray Data."""
    bundle, n = worker_bundle(settings), settings.train_num_workers
    placeable = sum(runs_that_fit(node, bundle, {}) for node in nodes) if bundle else math.inf
    if placeable < n:
        return (f"train_num_workers is {n} with train_worker_resources {bundle} per worker"
                f"{' (train_use_gpu: a GPU each)' if settings.train_use_gpu else ''}, but this cluster's nodes hold "
                f"{placeable} such worker(s); lower OPENFT_TRAIN_NUM_WORKERS or add nodes with those resources")
    total = {k: sum(node.get(k, 0.0) for node in nodes) for k in {k for node in nodes for k in node}}
    need = run_need(settings)
    if free_for(total, data_reserve(settings, need), online_need(settings), need) < 1:
        return (f"train_num_workers is {n} with train_worker_resources {bundle} per worker, which leaves less than "
                f"train_data_cpus ({settings.train_data_cpus:g}) CPUs of this cluster for the Ray Data reads that feed "
                f"them beside online serving's {online_need(settings) or 'nothing'}; lower OPENFT_TRAIN_NUM_WORKERS or "
                f"the workers' CPUs, lower OPENFT_ONLINE_MAX_REPLICAS or OPENFT_ONLINE_REPLICA_RESOURCES, or add nodes")
    return None


def data_reserve(settings: Settings, need: dict[str, float]) -> dict[str, float]:
    """The CPUs kept free beside work that takes CPUs, for the Ray Data tasks that feed it."""
    return {"CPU": settings.train_data_cpus} if "CPU" in need else {}


def runs_that_fit(total: dict[str, float], need: dict[str, float], reserve: dict[str, float]) -> int:
    """How many runs the cluster's `total` resources hold at once, after `reserve` (the CPUs kept for
    the Ray Data tasks that feed the workers: without them a run's reads starve and it never steps)."""
    if not need:
        return math.inf
    fits = [math.floor((total.get(k, 0.0) - reserve.get(k, 0.0)) / v + 1e-9) for k, v in need.items()]
    return max(0, min(fits))


# -- batches (issue 13) --
def batch_need(settings: Settings) -> dict[str, float]:
    """Ray resources one batch takes: every engine actor's."""
    need = {k: float(v) * settings.batch_engine_actors for k, v in settings.batch_engine_resources.items()}
    return {k: v for k, v in need.items() if v > 0}


def held(session, settings: Settings, *, runs: bool = True, batches: bool = True) -> dict[str, float]:
    """What the leased runs and batches hold on the cluster, by resource (from the database)."""
    from storage.batches import count_leased
    from storage.evals import count_leased_runs

    out: dict[str, float] = {}
    counts = []
    if runs:
        counts.append((run_need(settings), session.scalar(select(func.count()).select_from(Job).where(
            transitions.RUN.held()))))
    if batches:  # an eval run samples and grades on a batch's engine: it holds what a batch holds
        counts.append((batch_need(settings), count_leased(session) + count_leased_runs(session)))
    counts.append((online_need(settings), 1))  # online serving's most, whether it is scaled up or not
    for need, n in counts:
        for k, v in need.items():
            out[k] = out.get(k, 0.0) + v * n
    return out


def online_need(settings: Settings) -> dict[str, float]:
    """Ray resources online serving may take (issue 27): `online_max_replicas` replicas of
    `online_replica_resources` per served base. Kept out of what runs and batches count on, so that
    replicas scaling up under load never take a run's workers (nor wait behind them)."""
    per_base = {k: float(v) * settings.online_max_replicas for k, v in settings.online_replica_resources.items()}
    n = len(served_bases(settings.online_bases))
    return {k: v * n for k, v in per_base.items() if v > 0}


def free_for(total: dict[str, float], reserve: dict[str, float], taken: dict[str, float],
             need: dict[str, float]) -> int:
    """How many more of `need` fit in `total` after `reserve` and what is `taken`."""
    left = {k: total.get(k, 0.0) - taken.get(k, 0.0) for k in set(total) | set(taken)}
    return runs_that_fit(left, need, reserve)


@dataclass(frozen=True)
class Lost:
    job_id: str
    placement_group: str | None  # what the lost run reserved on the cluster, for the caller to free


def reconcile(db: Database, now: int, *, alive: Iterable[str], mine: str | None) -> list[Lost]:
    """Lose every run nothing drives any more. `alive`: this controller's live runs' lease tokens;
    `mine`: the prefix of this controller's tokens (its runs not in `alive` are known dead)."""

    def lose(session, job: Job, now: int) -> Lost:
        lost = Lost(job.id, job.run_placement_group)
        transitions.lose_run(session, job, now)
        return lost

    return leases.reconcile(db, transitions.RUN, now, alive=alive, mine=mine, lose=lose)


def reconcile_distills(db: Database, now: int, *, alive: Iterable[str], mine: str | None) -> list[str]:
    """Lose every distill lease nothing renews: the job is distilled again, or fails once out of attempts."""
    return leases.reconcile(db, transitions.DISTILL, now, alive=alive, mine=mine, lose=distilling.lose)


def expire_waiting(db: Database, now: int, limit_s: float) -> list[str]:
    with db.session() as session:
        since = func.coalesce(Job.waiting_since, Job.created_at)
        ids = session.scalars(select(Job.id).where(
            Job.status.in_(("validating_files", "queued")), Job.lease_owner.is_(None), since <= now - limit_s)).all()
    expired = []
    for job_id in ids:
        with db.session() as session:
            job = transitions.lock_job(session, job_id)
            if job is not None and transitions.expire_wait(session, job, now, limit_s).ok:
                expired.append(job_id)
    return expired


def claim_distills(db: Database, now: int, *, settings: Settings, new_owner: Callable[[], str]) -> list[Started]:
    """Lease the oldest waiting distill jobs while fewer than `max_concurrent_distills` are leased."""
    claimed: list[Started] = []
    with db.session() as session:
        leases.lock_scheduler(session)
        room = settings.max_concurrent_distills - distilling.in_flight(session)
        if room <= 0:
            return claimed
        waiting = session.scalars(
            select(Job.id).where(Job.status == "validating_files", Job.reason == transitions.DISTILLING,
                                 Job.lease_owner.is_(None)).order_by(Job.created_ns).limit(room)).all()
        for job_id in waiting:
            owner = new_owner()
            if distilling.take(session, job_id, now, owner=owner, lease_s=int(settings.run_lease_seconds)):
                claimed.append(Started(job_id, owner, session.get(Job, job_id).distill_attempts))
    return claimed


def start_runs(db: Database, now: int, *, settings: Settings, fit: float | Callable, new_owner: Callable[[], str]) -> list[Started]:
    """Start what the cap and `fit` (runs the cluster holds) allow; returns the runs started."""
    started: list[Started] = []
    with db.session() as session:
        leases.lock_scheduler(session)
        queued = session.execute(
            select(Job.id, Job.account_id, Job.reason)
            .where(Job.status == "queued", Job.lease_owner.is_(None)).order_by(Job.created_ns)
        ).all()
        if not queued:  # most passes: `fit` asks Ray's GCS, the dearest part of an idle pass
            return started
        if callable(fit):  # what fits beside the batches leased now (issue 13)
            fit = fit(session)
        leased = session.scalars(select(Job.account_id).where(transitions.RUN.held())).all()
        room = min(settings.max_concurrent_runs, fit) - len(leased)
        busy = set(leased)
        for job_id, account_id, reason in queued:
            if account_id in busy:
                continue
            if room <= 0:
                if reason != CAPACITY_REASON:
                    _wait_for_capacity(session, job_id, now)
                continue
            owner = new_owner()
            moved = transitions.start(session, job_id, now, owner=owner, lease_s=int(settings.run_lease_seconds),
                                      billing_enabled=settings.billing_enabled)
            if moved.ok:
                room -= 1
                busy.add(account_id)
                started.append(Started(job_id, owner, session.get(Job, job_id).attempts))
    return started


def _wait_for_capacity(session, job_id: str, now: int) -> None:
    job = transitions.lock_job(session, job_id)
    if job is not None and job.status == "queued" and job.reason != CAPACITY_REASON:
        job.reason = CAPACITY_REASON
        add_event(session, job_id, now, "Waiting for a training worker to become free.")
