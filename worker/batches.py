"""The worker's supervision of batches: each pass loses the batches nothing drives, deletes the
stages their drivers left, and claims batches under the capacity runs and batches share
(batches/scheduling.py); each claim is driven on a thread of its own (batches/run.py `drive`,
which holds the batch's lease under its heartbeat)."""

from __future__ import annotations

from functools import partial

from batches import run as batch_run
from batches import scheduling as batch_scheduling
from batches.transitions import BATCH
from jobs import scheduling
from storage import leases
from worker.work import Task


class BatchWork:
    kind = BATCH

    def __init__(self, ctl):
        self.ctl = ctl

    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]:
        return batch_scheduling.reconcile(self.ctl.db, now, alive=alive, mine=mine)

    def sweep(self, now: int) -> None:
        batch_run.sweep_stages(self.ctl.ctx)  # the stages of batches that ended without their driver

    def claim(self, now: int) -> list[Task]:
        claims = batch_scheduling.claim_batches(self.ctl.db, now, settings=self.ctl.settings, fit=self.fit,
                                                new_owner=lambda: leases.new_owner(self.ctl.id, self.kind))
        return [Task(claim.batch_id, claim.owner, partial(batch_run.drive, self.ctl.ctx, claim)) for claim in claims]

    def fit(self, session) -> float:
        """More batches the cluster holds beside the leased runs and batches (jobs/scheduling.py's rule)."""
        import ray

        settings = self.ctl.settings
        need = scheduling.batch_need(settings)
        taken = scheduling.held(session, settings)
        return scheduling.free_for(ray.cluster_resources(), scheduling.data_reserve(settings, need), taken, need)
