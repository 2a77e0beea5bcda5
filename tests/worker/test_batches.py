"""Batches in the real controller (`Controller`, in-process, real Ray for the cluster's
resources, scripted training runs): a running job's capacity is not taken by a batch, and a batch
cancelled while it waits is closed by the next pass anyway (closing takes no capacity)."""

from __future__ import annotations

import time

from batches import transitions
from tests.batches.test_lifecycle import World
from tests.factories import db_account, db_create_job, db_training_file
from tests.jobs.conftest import backend  # noqa: F401 (the fixture)
from tests.utils.polling import until
from tests.worker.runs import ScriptedRuns
from worker.controller import Controller


def test_a_running_job_keeps_its_capacity_and_a_waiting_cancel_is_closed(backend, ray_cluster):  # noqa: F811
    settings, db = backend()
    world = World(settings, db)
    account = db_account(db)
    job_id = db_create_job(db, account, db_training_file(db, account))
    ctl = Controller(settings, runs=ScriptedRuns(steps=400, step_s=0.02))
    try:
        assert ctl.tick() == [job_id]
        owner = world.account()
        waiting, cancelled = world.batch(owner), world.batch(owner)
        with db.session() as session:
            transitions.cancel(session, transitions.lock_batch(session, cancelled), int(time.time()))
        ctl.tick()
        assert until(lambda: world.get(cancelled).status == "cancelled", "the close of the cancelled batch")
        # The job's run holds the cluster's one slot: the other batch waits.
        assert world.get(waiting).status == "validating" and world.get(waiting).lease_owner is None
        ctl.tick()
        assert world.get(waiting).lease_owner is None
        assert world.get(cancelled).error_file_id is not None
        with db.session() as session:  # leave nothing for a later pass to run
            transitions.cancel(session, transitions.lock_batch(session, waiting), int(time.time()))
    finally:
        ctl.stop()
        for _, thread in [*ctl.runs.values(), *ctl.batches.values()]:
            thread.join(timeout=10)
        ctl.db.dispose()
