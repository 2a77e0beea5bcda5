"""The worker's supervision of eval runs: each pass loses the runs nothing drives and claims queued
runs under the capacity batches share (evals/scheduling.py); each claim is driven on a thread of
its own (evals/run.py `drive`, which holds the run's lease under its heartbeat)."""

from __future__ import annotations

from functools import partial

from evals import run as eval_run
from evals import scheduling as eval_scheduling
from evals.transitions import EVAL_RUN
from storage import leases
from worker.work import Task


class EvalRunWork:
    kind = EVAL_RUN

    def __init__(self, ctl, fit):
        self.ctl, self.fit = ctl, fit

    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]:
        return eval_scheduling.reconcile(self.ctl.db, now, alive=alive, mine=mine)

    def sweep(self, now: int) -> None:
        pass  # an ended run leaves only rows, whose retention is the API's (serve_app/services/retention.py)

    def claim(self, now: int) -> list[Task]:
        claims = eval_scheduling.claim_runs(self.ctl.db, now, settings=self.ctl.settings, fit=self.fit,
                                            new_owner=lambda: leases.new_owner(self.ctl.id, self.kind))
        return [Task(claim.run_id, claim.owner, partial(eval_run.drive, self.ctl.ctx, claim)) for claim in claims]
