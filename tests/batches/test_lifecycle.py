"""A batch's life on a database of each test's own (SQLite and PostgreSQL), without an engine:
the compare-and-set transitions and the lease, cancel and expiry before a batch runs (closed with
every line in the error file), lost drivers, the capacity runs and batches share, staged adapter
copies that outlive a deleted model, the billing hold and charge, and two accounts."""

from __future__ import annotations

import time

import orjson
import pytest
from sqlalchemy import select

from batches import run as batch_run
from batches import scheduling, transitions
from batches.plan import Plan
from jobs import scheduling as job_scheduling
from jobs import transitions as job_transitions
from openft.errors import RateLimited
from openft.pricing import DEFAULT_RATES, BaseRate, PriceTable
from serve_app.services import batches as service
from serve_app.services.models import delete_model
from serve_app.state import AppState
from storage import keys, leases
from storage.billing import credit
from storage.models import Account, Batch, File, Job, LedgerEntry
from storage.objects import open_object_store
from tests.factories import (
    JOB_MODEL,
    batch_request_line,
    db_account,
    db_create_job,
    db_ft_model,
    db_stored_file,
    db_training_file,
    jsonl,
)
from tests.jobs.conftest import backend  # noqa: F401 (the fixture)

NOW = int(time.time())


class World:
    def __init__(self, settings, db):
        self.settings, self.db = settings, db
        self.store = open_object_store(settings.resolved_storage_url())
        self.state = AppState(settings, db, self.store)
        self.ctx = batch_run.Context(settings, db, self.store)

    def account(self, deposit_usd: str | None = None) -> Account:
        account_id = db_account(self.db, deposit_usd=deposit_usd)
        with self.db.session() as session:
            account = session.get(Account, account_id)
            session.expunge(account)
            return account

    def batch(self, account: Account, *models: str) -> str:
        data = jsonl(batch_request_line(f"req-{i}", model=m, max_tokens=8) for i, m in enumerate(models or [JOB_MODEL]))
        file_id = db_stored_file(self.settings, account.id, data, purpose="batch", stats={"rows": len(models) or 1})
        return service.create_batch(self.state, account, {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                          "completion_window": "24h"}).id

    def get(self, batch_id: str) -> Batch:
        with self.db.session() as session:
            row = session.get(Batch, batch_id)
            session.expunge(row)
            return row

    def claim(self, now: int = NOW, fit: float = 1) -> list[scheduling.Claim]:
        return scheduling.claim_batches(self.db, now, settings=self.settings, fit=lambda session: fit,
                                        new_owner=lambda: f"ctl-test.b{time.time_ns()}")

    def lines(self, file_id: str) -> list[dict]:
        with self.db.session() as session:
            row = session.get(File, file_id)
            assert row.purpose == "batch_output"
            key = row.object_key
        return [orjson.loads(line) for line in self.store.get_bytes(key).splitlines()]


@pytest.fixture
def world(backend):  # noqa: F811
    return World(*backend(batch_completion_window_seconds=60))


def test_cancel_before_it_runs_closes_it_with_every_line_in_the_error_file(world):
    account = world.account()
    batch_id = world.batch(account, JOB_MODEL, JOB_MODEL, JOB_MODEL)
    assert world.claim(fit=0) == []  # no capacity: it waits in validating
    with world.db.session() as session:
        assert transitions.cancel(session, transitions.lock_batch(session, batch_id), NOW).status == "cancelling"
    claims = world.claim(fit=0)  # closing takes no capacity
    assert [(c.batch_id, c.close) for c in claims] == [(batch_id, "cancelled")]
    batch_run.drive(world.ctx, claims[0])
    row = world.get(batch_id)
    assert (row.status, row.lease_owner, row.output_file_id) == ("cancelled", None, None)
    assert row.cancelled_at >= row.cancelling_at and row.in_progress_at is None
    assert row.request_counts == {"total": 3, "completed": 0, "failed": 3}
    lines = world.lines(row.error_file_id)
    assert [line["custom_id"] for line in lines] == ["req-0", "req-1", "req-2"]
    assert {line["error"]["code"] for line in lines} == {"batch_cancelled"}
    assert all(line["response"] is None and line["id"].startswith("batch_req_") for line in lines)
    assert world.claim() == []  # ended: nothing to claim
    with world.db.session() as session:
        assert not transitions.cancel(session, transitions.lock_batch(session, batch_id), NOW).ok


def test_the_completion_window_expires_a_waiting_batch(world):
    account = world.account()
    batch_id = world.batch(account, JOB_MODEL, JOB_MODEL)
    row = world.get(batch_id)
    assert row.expires_at == row.created_at + 60
    claims = world.claim(now=row.expires_at, fit=0)
    assert [c.close for c in claims] == ["expired"]
    batch_run.drive(world.ctx, claims[0])
    row = world.get(batch_id)
    assert row.status == "expired" and row.expired_at is not None and row.request_counts["failed"] == 2
    assert {line["error"]["code"] for line in world.lines(row.error_file_id)} == {"batch_expired"}


def test_the_lease_decides_who_drives_and_a_lost_driver_runs_it_again_once(world):
    account = world.account()
    batch_id = world.batch(account)
    [first] = world.claim()
    assert world.claim() == []  # leased: no second driver, and the cap (1) is full
    with world.db.session() as session:
        assert not transitions.begin(session, batch_id, "someone-else", NOW, billing_enabled=False, quote=None).ok
        assert not leases.renew(session, transitions.BATCH, batch_id, "someone-else", NOW, 2)
    with world.db.session() as session:
        moved = transitions.begin(session, batch_id, first.owner, NOW, billing_enabled=False, quote=None)
    assert moved.status == "in_progress" and world.get(batch_id).in_progress_at == NOW
    with world.db.session() as session:
        assert leases.renew(session, transitions.BATCH, batch_id, first.owner, NOW, 2)
        seen = transitions.seen(session, batch_id)
    assert seen.stop_reason(NOW) is None and seen.stop_reason(seen.expires_at) == "expired"

    # Its controller dies: the lease lapses and the next pass runs it again from the start.
    assert scheduling.reconcile(world.db, NOW + 10, alive=set(), mine="ctl-other.") == [batch_id]
    row = world.get(batch_id)
    assert (row.status, row.lease_owner) == ("in_progress", None)
    [second] = world.claim()
    assert second.close is None and world.get(batch_id).attempts == 2
    with world.db.session() as session:  # the first driver's late writes change nothing
        assert transitions.finish(session, batch_id, first.owner, NOW, stopped=None, counts={}, output_file_id=None,
                                  error_file_id=None, usage=None).status is None
    assert scheduling.reconcile(world.db, NOW + 20, alive=set(), mine="ctl-other.") == [batch_id]
    row = world.get(batch_id)
    assert row.status == "failed" and row.errors[0]["code"] == "batch_interrupted" and row.failed_at == NOW + 20
    world.store.put_bytes(keys.batch_stage(batch_id) + "m1/adapter_config.json", b"{}")  # what the lost run staged
    assert batch_run.sweep_stages(world.ctx) == [batch_id]
    assert list(world.store.list(keys.batch_stage(batch_id))) == [] and batch_run.sweep_stages(world.ctx) == []


def test_a_batch_whose_ray_process_is_lost_runs_again_and_its_own_failure_is_recorded(world, ray_cluster):
    """CI saw a dying service's merge recorded as failed: its Ray node went first, and the worker's
    thread still driving the work met NodeDiedError. `leases.drive` records no end for work Ray lost
    (a real worker exit here); the thread ends, the next pass loses the row and it runs again."""
    import os

    @ray_cluster.remote(num_cpus=0, max_retries=0)
    def ends_its_process():
        os._exit(1)

    @ray_cluster.remote(num_cpus=0, max_retries=0)
    def raises():
        raise ValueError("the work's own failure")

    batch_id = world.batch(world.account())
    [claim] = world.claim()
    with world.db.session() as session:
        transitions.begin(session, batch_id, claim.owner, NOW, billing_enabled=False, quote=None)
    failed = []
    leases.drive(transitions.BATCH, batch_id, lambda: ray_cluster.get(ends_its_process.remote()),
                 lambda: failed.append(claim.owner))
    row = world.get(batch_id)
    assert (failed, row.status, row.lease_owner) == ([], "in_progress", claim.owner)
    # Its thread has ended: the controller's next pass finds its own token not alive.
    assert scheduling.reconcile(world.db, NOW, alive=set(), mine="ctl-test.") == [batch_id]
    assert (world.get(batch_id).status, world.get(batch_id).lease_owner) == ("in_progress", None)
    [again] = world.claim()
    assert world.get(batch_id).attempts == 2
    leases.drive(transitions.BATCH, batch_id, lambda: ray_cluster.get(raises.remote()),
                 lambda: failed.append(again.owner))
    assert failed == [again.owner]


def test_a_cancel_reaches_a_running_driver_through_its_heartbeat(world):
    account = world.account()
    batch_id = world.batch(account)
    [claim] = world.claim()
    with world.db.session() as session:
        transitions.begin(session, batch_id, claim.owner, NOW, billing_enabled=False, quote=None)
    beat = batch_run.heartbeat(world.ctx, claim, total=1, counts=[0, 0])
    assert beat.beat()
    assert batch_run.stop_reason(beat) is None
    with world.db.session() as session:
        transitions.cancel(session, transitions.lock_batch(session, batch_id), NOW)
    assert beat.beat()
    assert batch_run.stop_reason(beat) == "cancelled"
    with world.db.session() as session:
        moved = transitions.finish(session, batch_id, claim.owner, NOW, stopped="cancelled",
                                   counts={"total": 1, "completed": 0, "failed": 1}, output_file_id=None,
                                   error_file_id=None, usage=None)
    assert moved.status == "cancelled" and world.get(batch_id).cancelled_at == NOW


def test_runs_and_batches_share_the_cluster(world):
    """On 2 CPUs with 1 kept for Ray Data: one run or one batch at a time, never both."""
    settings, total = world.settings, {"CPU": 2.0}
    reserve = {"CPU": settings.train_data_cpus}

    def run_fit(session):
        return job_scheduling.free_for(total, reserve, job_scheduling.held(session, settings, runs=False),
                                       job_scheduling.run_need(settings))

    def batch_fit(session):
        return job_scheduling.free_for(total, reserve, job_scheduling.held(session, settings),
                                       job_scheduling.batch_need(settings))

    account = world.account()
    batch_id = world.batch(account)
    [claim] = scheduling.claim_batches(world.db, NOW, settings=settings, fit=batch_fit, new_owner=lambda: "ctl-x.b1")
    job_account = db_account(world.db)
    job_id = db_create_job(world.db, job_account, db_training_file(world.db, job_account))
    assert job_scheduling.start_runs(world.db, NOW, settings=settings, fit=run_fit, new_owner=lambda: "ctl-x.r1") == []
    with world.db.session() as session:
        transitions.finish(session, batch_id, claim.owner, NOW, stopped=None, counts={}, output_file_id=None,
                           error_file_id=None, usage=None)
    [started] = job_scheduling.start_runs(world.db, NOW, settings=settings, fit=run_fit, new_owner=lambda: "ctl-x.r2")
    assert started.job_id == job_id
    second = world.batch(account)
    assert scheduling.claim_batches(world.db, NOW, settings=settings, fit=batch_fit, new_owner=lambda: "ctl-x.b2") == []
    assert world.get(second).status == "validating"
    with world.db.session() as session:
        job_transitions.run_ended(session, job_id, "ctl-x.r2", NOW, paused=False)
    claims = scheduling.claim_batches(world.db, NOW, settings=settings, fit=batch_fit, new_owner=lambda: "ctl-x.b3")
    assert [c.batch_id for c in claims] == [second]


def test_online_servings_most_is_kept_out_of_what_runs_and_batches_count_on(world):
    """Online replicas scale up under load after a run has started: their most (online_max_replicas
    per served base) is counted as held from the start, so a run never waits behind them (issue 27)."""
    settings = world.settings.model_copy(update={"online_bases": [JOB_MODEL], "online_replica_resources": {"CPU": 1},
                                                 "online_max_replicas": 2})  # fmt: skip
    assert job_scheduling.online_need(settings) == {"CPU": 2.0}
    assert job_scheduling.online_need(world.settings.model_copy(update={"online_replica_resources": {"CPU": 0}})) == {}
    with world.db.session() as session:
        assert job_scheduling.held(session, settings) == {"CPU": 2.0}
        held = job_scheduling.held(session, settings)
    reserve, need = {"CPU": settings.train_data_cpus}, job_scheduling.run_need(settings)
    assert job_scheduling.free_for({"CPU": 4.0}, reserve, held, need) == 1
    assert job_scheduling.free_for({"CPU": 3.0}, reserve, held, need) == 0
    problem = job_scheduling.placement_problem(settings, [{"CPU": 3.0}])
    assert "online serving's {'CPU': 2.0}" in problem and "OPENFT_ONLINE_MAX_REPLICAS" in problem
    assert job_scheduling.placement_problem(settings, [{"CPU": 4.0}]) is None


def test_a_staged_copy_outlives_the_model_deleted_mid_batch(world):
    account = world.account()
    kept, gone = db_ft_model(world.db, world.store, account.id), db_ft_model(world.db, world.store, account.id)
    batch_id = world.batch(account, JOB_MODEL, kept, gone)
    delete_model(world.state, account, gone)  # before the batch started: its lines are refused
    [claim] = world.claim()
    batch = world.get(batch_id)
    models, refused = batch_run.stage(world.ctx, batch, Plan.from_record(batch.plan))
    assert [name for name, _ in models] == [JOB_MODEL, kept] and models[0][1] is None
    assert refused[gone].code == "model_not_found" and refused[gone].status_code == 404
    staged = models[1][1]
    assert staged.startswith(keys.batch_stage(batch_id))
    delete_model(world.state, account, kept)  # while the batch runs: the batch keeps its copy
    assert world.store.get_bytes(staged + "adapter_model.safetensors") == b"\0" * 64
    batch_run._delete_stage(world.ctx, batch_id)
    assert list(world.store.list(keys.batch_stage(batch_id))) == []
    assert world.get(batch_id).stage_deleted_at is not None


def test_billing_holds_the_quote_and_charges_real_tokens(backend):  # noqa: F811
    rates = {**DEFAULT_RATES, JOB_MODEL: BaseRate(supervised_usd_per_mtok=0.4, dpo_usd_per_mtok=0.8,
                                                  batch_usd_per_mtok=100.0)}  # a few lines cost cents
    world = World(*backend(billing_enabled=True, prices=PriceTable(rates=rates)))
    poor, rich = world.account(deposit_usd="0.01"), world.account(deposit_usd="10.00")
    models = [JOB_MODEL] * 20
    poor_batch, rich_batch = world.batch(poor, *models), world.batch(rich, *models)
    quote = world.get(rich_batch).quote
    assert 1 < quote["max_charge_cents"] < 1000 and quote["tokens_upper_bound"] <= 20 * 2048
    assert quote["batch_usd_per_mtok"] == world.settings.prices.batch_usd_per_mtok(JOB_MODEL)
    claims = {c.batch_id: c for c in world.claim(fit=2)}
    assert set(claims) == {poor_batch}  # max_concurrent_batches is 1
    with world.db.session() as session:
        moved = transitions.begin(session, poor_batch, claims[poor_batch].owner, NOW, billing_enabled=True,
                                  quote=world.get(poor_batch).quote)
    row = world.get(poor_batch)
    assert moved.status == "failed" and row.errors[0]["code"] == "insufficient_quota" and row.failed_at == NOW
    assert row.lease_owner is None and row.charge is None
    [claim] = world.claim()
    with world.db.session() as session:
        transitions.begin(session, rich_batch, claim.owner, NOW, billing_enabled=True, quote=quote)
        assert credit(session, rich.id).held_cents == quote["max_charge_cents"]
    # Far more real tokens than the bound would cost more than the hold: the charge stops at the hold.
    with world.db.session() as session:
        transitions.finish(session, rich_batch, claim.owner, NOW, stopped=None, counts={}, output_file_id=None,
                           error_file_id=None, usage=None, billed_tokens=10**9)
    row = world.get(rich_batch)
    assert row.charge["cents"] == quote["max_charge_cents"] and row.charge["basis"] == "max_charge"
    with world.db.session() as session:
        assert credit(session, rich.id).held_cents == 0
        kinds = session.scalars(select(LedgerEntry.kind).where(LedgerEntry.job_id == rich_batch)).all()
    assert sorted(kinds) == ["charge", "hold", "release"]


def test_each_account_has_its_own_open_batch_limit(world):
    first, second = world.account(), world.account()
    world.batch(first)
    world.batch(first)
    with pytest.raises(RateLimited) as info:
        world.batch(first)
    assert info.value.extra["limit"] == {"limit": 2, "current": 2}
    world.batch(second)  # the other account's batches do not count
    with world.db.session() as session:
        assert session.scalar(select(Job.id)) is None  # and no job was made along the way


def test_a_cancel_between_claim_and_start_closes_the_batch_without_running(world):
    account = world.account()
    batch_id = world.batch(account, JOB_MODEL, JOB_MODEL)
    [claim] = world.claim()
    with world.db.session() as session:
        transitions.cancel(session, transitions.lock_batch(session, batch_id), NOW)
    batch_run.drive(world.ctx, claim)  # begin refuses (cancelling): the driver closes it instead
    row = world.get(batch_id)
    assert (row.status, row.in_progress_at, row.lease_owner) == ("cancelled", None, None)
    assert {line["error"]["code"] for line in world.lines(row.error_file_id)} == {"batch_cancelled"}
