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

from batches import scheduling as batch_scheduling
from evals import transitions
from openft.settings import Settings
from storage import leases
from storage.db import Database
from storage.evals import waiting_runs
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
        room = batch_scheduling.engine_room(session, settings)
        waiting = waiting_runs(session, int(min(room, 1000))) if room > 0 else ()
        for run_id in batch_scheduling.admitted(waiting, room, fit, session):
            owner = new_owner()
            if transitions.claim(session, run_id, now, owner=owner, lease_s=int(settings.run_lease_seconds)).ok:
                claims.append(Claim(run_id, owner))
    return claims
