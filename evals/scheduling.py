"""The controller's eval-run passes: lose the runs nothing drives, and claim queued runs to drive.

Where it sits: worker/evals.py calls these every pass, after the batches' (a run samples on the
batch engine, so it waits its turn behind them under the same rule): under the scheduler's lock,
queued runs oldest first while the leased batches and runs together stay under
`max_concurrent_batches` and the cluster has room for one more batch's engine beside the leased
training runs, batches and eval runs (`fit(session)`: jobs/scheduling.py's shared rule, which
counts leased eval runs as batches).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evals import transitions
from openft.settings import Settings
from storage import leases
from storage.batches import count_leased
from storage.db import Database
from storage.evals import count_leased_runs, waiting_runs
from storage.models import EvalRun


@dataclass(frozen=True)
class Claim:
    run_id: str
    owner: str


def reconcile(db: Database, now: int, *, alive: Iterable[str], mine: str | None) -> list[str]:
    def lose(session, run: EvalRun, now: int) -> str:
        transitions.lose(session, run, now)
        return run.id

    return leases.reconcile(db, transitions.EVAL_RUN, now, alive=alive, mine=mine, lose=lose)


def claim_runs(db: Database, now: int, *, settings: Settings, fit: Callable[[object], float],
               new_owner: Callable[[], str]) -> list[Claim]:
    claims: list[Claim] = []
    with db.session() as session:
        leases.lock_scheduler(session)
        room = settings.max_concurrent_batches - count_leased(session) - count_leased_runs(session)
        waiting = waiting_runs(session, int(min(room, 1000))) if room > 0 else ()
        # The cluster is asked (`fit`: Ray's GCS, the dearest part of an idle pass) only when a run waits.
        for run_id in waiting[:max(0, int(min(room, fit(session))))] if waiting else ():
            owner = new_owner()
            if transitions.claim(session, run_id, now, owner=owner, lease_s=int(settings.run_lease_seconds)).ok:
                claims.append(Claim(run_id, owner))
    return claims
