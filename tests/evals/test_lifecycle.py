"""An eval run's life on a database of each test's own (SQLite and PostgreSQL): a jsonl run driven
in this process by the real driver (evals/run.py: string checks need no engine), the lease and a
lost driver (requeued once, then eval_run_interrupted), cancel, two workers racing for one run on
PostgreSQL, and the billing hold and charge."""

from __future__ import annotations

import threading
import time

import pytest

from evals import run as eval_run
from evals import scheduling, transitions
from openft.pricing import DEFAULT_RATES, BaseRate, PriceTable
from serve_app.services import eval_runs as runs
from serve_app.services import evals as eval_service
from storage import evals as repo
from storage import leases
from storage.billing import credit
from storage.models import Account, EvalRun, WebhookDelivery
from tests.batches import test_lifecycle as batch_world
from tests.factories import JOB_MODEL
from tests.jobs.conftest import backend, postgres  # noqa: F401 (the fixtures)

NOW = int(time.time())
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
EXACT = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
         "operation": "eq"}
ITEMS = [{"item": {"answer": "Paris"}, "sample": {"output_text": "Paris"}},
         {"item": {"answer": "Rome"}, "sample": {"output_text": "Milan"}},
         {"item": {"answer": "Oslo"}, "sample": {"output_text": "Oslo"}}]


class World(batch_world.World):
    """The batch tests' world (settings, database, store, the API's state and the worker's context,
    accounts), with runs in place of batches."""

    def run(self, account: Account, criteria=(EXACT,), items=ITEMS, eval_id: str | None = None) -> str:
        eval_id = eval_id or eval_service.create_eval(self.state, account, {
            "data_source_config": {"type": "custom", "item_schema": SCHEMA, "include_sample_schema": True},
            "testing_criteria": list(criteria)}).id
        return runs.create_run(self.state, account, eval_id, {"data_source": {
            "type": "jsonl", "source": {"type": "file_content", "content": list(items)}}}).id

    def get(self, run_id: str) -> EvalRun:
        with self.db.session() as session:
            row = session.get(EvalRun, run_id)
            session.expunge(row)
            return row

    def claim(self, now: int = NOW, fit: float = 1) -> list[scheduling.Claim]:
        return scheduling.claim_runs(self.db, now, settings=self.settings, fit=lambda session: fit,
                                     new_owner=lambda: f"ctl-test.e{time.time_ns()}")


@pytest.fixture
def world(backend):  # noqa: F811
    return World(*backend())


def test_a_jsonl_run_is_claimed_driven_graded_and_counted(world):
    account = world.account()
    run_id = world.run(account)
    assert world.get(run_id).status == "queued"
    [claim] = world.claim()
    assert world.claim() == []  # leased: no second driver
    world.batch(account)
    assert batch_world.World.claim(world, fit=2) == []  # a leased run holds the batches' cap (1) too
    eval_run.drive(world.ctx, claim)
    row = world.get(run_id)
    assert (row.status, row.lease_owner, row.error) == ("completed", None, None)
    assert row.result_counts == {"total": 3, "passed": 2, "failed": 1, "errored": 0}
    assert row.per_criteria == [{"testing_criteria": "exact", "passed": 2, "failed": 1}]
    assert row.per_model_usage == []  # nothing was sampled or model-graded
    with world.db.session() as session:
        items = repo.all_items(session, run_id)
        assert [(i.item_index, i.status, i.results[0]["score"]) for i in items] == [
            (0, "pass", 1.0), (1, "fail", 0.0), (2, "pass", 1.0)]
        assert items[1].sample["output"] == [{"role": "assistant", "content": "Milan"}]


def test_a_lost_driver_is_requeued_once_keeping_its_items_then_the_run_fails(world):
    account = world.account()
    run_id = world.run(account)
    [first] = world.claim()
    with world.db.session() as session:
        assert transitions.begin(session, run_id, first.owner, NOW, billing_enabled=False, quote=None).ok
        assert not transitions.begin(session, run_id, "someone-else", NOW, billing_enabled=False, quote=None).ok
    # Its controller dies: the lease lapses, the run goes back to the queue.
    assert scheduling.reconcile(world.db, NOW + 10, alive=set(), mine="ctl-other.") == [run_id]
    assert (world.get(run_id).status, world.get(run_id).lease_owner) == ("queued", None)
    with world.db.session() as session:  # the lost driver's late writes change nothing
        assert transitions.finish(session, run_id, first.owner, NOW, counts={}, per_criteria=[], usage=[],
                                  billed_tokens=0).status is None
        assert not transitions.record(session, run_id, first.owner, [])
    [second] = world.claim()
    assert world.get(run_id).attempts == 2
    with world.db.session() as session:
        transitions.begin(session, run_id, second.owner, NOW, billing_enabled=False, quote=None)
    assert scheduling.reconcile(world.db, NOW + 20, alive=set(), mine="ctl-other.") == [run_id]
    row = world.get(run_id)
    assert (row.status, row.error["code"], row.lease_owner) == ("failed", "eval_run_interrupted", None)
    assert world.claim() == []


def test_cancel_ends_the_run_at_once_and_a_driver_that_claimed_it_lets_go(world):
    account = world.account()
    queued = world.run(account)
    with world.db.session() as session:
        moved = transitions.cancel(session, transitions.lock_run(session, queued), NOW)
    assert moved.ok and world.get(queued).status == "canceled" and world.claim() == []
    with world.db.session() as session:
        again = transitions.cancel(session, transitions.lock_run(session, queued), NOW)
        assert (again.ok, again.status) == (False, "canceled")
    claimed = world.run(account)
    [claim] = world.claim()
    with world.db.session() as session:  # canceled between the claim and the driver's begin
        assert transitions.cancel(session, transitions.lock_run(session, claimed), NOW).status == "canceled"
    eval_run.drive(world.ctx, claim)
    row = world.get(claimed)
    assert (row.status, row.lease_owner, row.result_counts["total"]) == ("canceled", None, 0)


def test_items_a_driver_finished_before_a_cancel_are_kept_and_counted(world):
    account = world.account()
    run_id = world.run(account)
    [claim] = world.claim()
    with world.db.session() as session:
        transitions.begin(session, run_id, claim.owner, NOW, billing_enabled=False, quote=None)
    with world.db.session() as session:
        transitions.cancel(session, transitions.lock_run(session, run_id), NOW)
    row = world.get(run_id)
    todo = {0: ITEMS[0], 1: ITEMS[1]}  # two of three finished when the cancel came
    made = {i: eval_run.samples.given(item) for i, item in todo.items()}
    items = eval_run.graded(row, todo, made, eval_run.runtime_for(world.ctx, row, canceled=True))
    eval_run.record_and_finish(world.ctx, claim, row, eval_run.RunPlan.from_record(row.plan), items)
    row = world.get(run_id)
    assert (row.status, row.lease_owner) == ("canceled", None)
    assert row.result_counts == {"total": 2, "passed": 1, "failed": 1, "errored": 0}
    with world.db.session() as session:
        assert [i.item_index for i in repo.all_items(session, run_id)] == [0, 1]


def test_two_workers_racing_for_one_run_one_drives_it(postgres):  # noqa: F811
    world = World(*postgres(max_concurrent_batches=4))
    run_id = world.run(world.account())
    got: list = []
    barrier = threading.Barrier(2)

    def race():
        barrier.wait()
        got.extend(world.claim(fit=4))

    threads = [threading.Thread(target=race) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [c.run_id for c in got] == [run_id] and world.get(run_id).attempts == 1


def test_billing_holds_the_quote_at_the_batch_rate_and_charges_real_tokens(backend):  # noqa: F811
    rates = {**DEFAULT_RATES, JOB_MODEL: BaseRate(supervised_usd_per_mtok=0.4, dpo_usd_per_mtok=0.8,
                                                  batch_usd_per_mtok=100.0)}
    world = World(*backend(billing_enabled=True, prices=PriceTable(rates=rates)))
    poor, rich = world.account(deposit_usd="0.01"), world.account(deposit_usd="10.00")
    judge = {"type": "label_model", "name": "judge", "model": JOB_MODEL, "labels": ["yes", "no"],
             "passing_labels": ["yes"], "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    runs_ = {who: world.run(who, criteria=(EXACT, judge)) for who in (poor, rich)}
    plan = world.get(runs_[rich]).plan
    assert plan["rate_base_id"] == JOB_MODEL and plan["tokens_upper_bound"] >= 3
    from batches.billing import quote as batch_quote
    quote = batch_quote(world.settings, JOB_MODEL, plan["tokens_upper_bound"])
    assert quote["batch_usd_per_mtok"] == 100.0
    for who, expect in ((poor, "failed"), (rich, "in_progress")):
        [claim] = [c for c in world.claim(fit=2) if c.run_id == runs_[who]]
        with world.db.session() as session:
            moved = transitions.begin(session, runs_[who], claim.owner, NOW, billing_enabled=True, quote=quote)
        assert world.get(runs_[who]).status == expect
        if who is poor:
            assert world.get(runs_[who]).error["code"] == "insufficient_quota" and not moved.ok
    with world.db.session() as session:
        assert credit(session, rich.id).held_cents == quote["max_charge_cents"]
        transitions.finish(session, runs_[rich], claim.owner, NOW, counts={}, per_criteria=[], usage=[],
                           billed_tokens=10**9)
    row = world.get(runs_[rich])
    assert row.charge["cents"] == quote["max_charge_cents"] and row.charge["basis"] == "max_charge"
    with world.db.session() as session:
        assert credit(session, rich.id).held_cents == 0
        events = session.query(WebhookDelivery).filter(WebhookDelivery.account_id == rich.id).all()
    assert events == []  # no endpoint subscribed: nothing owed
    assert leases.exhausted(transitions.EVAL_RUN, row) is False


def test_a_run_its_items_and_objects_expire_with_files_once_it_ended(world):
    from serve_app.services.retention import reap_once
    from storage import keys

    account = world.account()
    ended, going = world.run(account), world.run(account)
    [claim] = world.claim()  # the oldest: one at a time (max_concurrent_batches)
    assert claim.run_id == ended
    eval_run.drive(world.ctx, claim)
    assert world.get(ended).status == "completed"
    later = int(time.time()) + world.settings.file_retention_days * 86400 + 60
    assert reap_once(world.state, now=later)["eval_runs"] == 1
    with world.db.session() as session:
        assert session.get(EvalRun, ended) is None and repo.all_items(session, ended) == []
        assert session.get(EvalRun, going).status == "queued"  # not ended: kept
    assert list(world.store.list(keys.eval_run(account.id, ended))) == []
    assert list(world.store.list(keys.eval_run(account.id, going)))


def test_deleting_the_eval_deletes_its_runs_items_and_objects(world):
    from storage import keys

    account = world.account()
    ended = world.run(account)
    eval_id = world.get(ended).eval_id
    going = world.run(account, eval_id=eval_id)
    [claim] = world.claim()
    eval_run.drive(world.ctx, claim)
    eval_service.delete_eval(world.state, account, eval_id)
    with world.db.session() as session:
        assert [session.get(EvalRun, r) for r in (ended, going)] == [None, None]
        assert repo.all_items(session, ended) == []
    assert [list(world.store.list(keys.eval_run(account.id, r))) for r in (ended, going)] == [[], []]
