"""The worker's supervision of distill-shortcut jobs: a job created on a batch results file is
distilled on a thread of its own under a distill lease (jobs/distilling.py), at most
`max_concurrent_distills` at once. A distiller that dies lets its lease lapse; the next pass
distills the job again (or fails it once out of attempts)."""

from __future__ import annotations

import time
from functools import partial

from jobs import distilling, scheduling
from storage import leases
from storage.leases import Heartbeat
from worker.work import Task


class DistillWork:
    kind = distilling.DISTILL

    def __init__(self, ctl):
        self.ctl = ctl

    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]:
        return scheduling.reconcile_distills(self.ctl.db, now, alive=alive, mine=mine)

    def sweep(self, now: int) -> None:
        pass  # a distill leaves only its job's files, which go with the job

    def claim(self, now: int) -> list[Task]:
        claims = scheduling.claim_distills(self.ctl.db, now, settings=self.ctl.settings,
                                           new_owner=lambda: leases.new_owner(self.ctl.id, self.kind))
        return [Task(claim.job_id, claim.owner, partial(self.drive, claim)) for claim in claims]

    def drive(self, claim: scheduling.Started) -> None:
        """Distill one job while its heartbeat renews the lease; a stopping worker stops renewing,
        so the lease lapses and the next worker distills the job again."""
        ctx = self.ctl.ctx

        def fail():
            with ctx.db.session() as session:
                distilling.failed(session, claim.job_id, claim.owner, int(time.time()), code="distill_failed",
                                  message="Distilling training_file failed for another reason. Create the job "
                                  "again, or call POST /v1/files/distill and create it on the files it makes.",
                                  param="training_file")

        with Heartbeat(ctx.db, self.kind, claim.job_id, claim.owner, ctx.settings.run_lease_seconds,
                       stopping=self.ctl.stopping):
            leases.drive(self.kind, claim.job_id, lambda: distilling.distill_job(ctx, claim.job_id, claim.owner),
                         lambda: ctx.retrying(fail, "fail the distillation"))
