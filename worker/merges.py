"""The worker's supervision of merges: each pass expires exports, loses the merges nothing runs,
and claims queued ones (merge/worker.py); each claim runs on a thread of its own
(`process_merge`, under the merge's heartbeat)."""

from __future__ import annotations

from functools import partial

from merge import worker as merges
from storage import leases
from worker.work import Task


class MergeWork:
    kind = merges.MERGE

    def __init__(self, ctl):
        self.ctl = ctl

    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]:
        return merges.reconcile(self.ctl.ctx, now, alive=alive, mine=mine)

    def sweep(self, now: int) -> None:
        merges.expire_exports(self.ctl.db, self.ctl.store, now=now)

    def claim(self, now: int) -> list[Task]:
        claims = merges.claim_pending_merges(self.ctl.db, now=now, lease_s=self.ctl.settings.run_lease_seconds,
                                             new_owner=lambda: leases.new_owner(self.ctl.id, self.kind))
        ctl = self.ctl
        return [Task(claim.merge_id, claim.owner, partial(merges.process_merge, ctl.settings, claim, db=ctl.db,
                                                          store=ctl.store, stopping=ctl.stopping)) for claim in claims]
