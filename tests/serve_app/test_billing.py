"""Billing: the credit hold at start, the per-token charge at the end, limits, the admin API.

Two setups. The job controller's rules run in-process on a data dir of each test's own
(`Controller(settings)`, real SQLite, real local store, real Ray for its capacity check):
jobs are put in the statuses the API creates (queued, with the quote's `per_token`) and the
controller moves them on: `tick` (hold or insufficient_quota), `conclude` (success,
adapter_quota_exceeded, failures), `reconcile`, the 24-hour expiry. The admin API, the limits at
create and gridline.charge go through a deployment with billing on (`apis("billing", ...)`)
with the real `openai` SDK and httpx; the UTC-day limit calls `create_job` in-process on that
deployment's data dir with a clock the test moves.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from sqlalchemy import func, select

from jobs import transitions
from jobs.scheduling import Started
from openft.errors import RateLimited
from openft.ids import job_id as new_job_id
from openft.settings import Settings
from serve_app.services.fine_tuning_jobs import cancel_job, create_job
from serve_app.state import AppState
from storage import billing
from storage.accounts import create_account
from storage.db import Database
from storage.leases import LeaseLost
from storage.models import Account, FineTunedModel, Job, JobEvent, LedgerEntry
from storage.objects import open_object_store
from tests.conftest import ADMIN_KEY
from tests.factories import create_jobs_in_parallel
from tests.serve_app.test_jobs_api import TRAIN, upload
from train.attempt import AttemptResult

MODEL = "qwen2.5-0.5b-instruct"
DAY = 86400


# -- in-process controller setup -----------------------------------------------------------
@pytest.fixture
def own(tmp_path: Path, ray_cluster):
    """Settings on a data dir of this test's own, billing on; the controller needs no free CPU."""
    settings = Settings(data_dir=tmp_path / "d", model_source="standin", billing_enabled=True,
                        train_worker_resources={}, max_concurrent_runs=8,
                        parity_check=False)  # `conclude` here registers placeholder adapters no model can load
    db = Database(settings.resolved_database_url())
    yield settings, db
    db.dispose()


def controller(settings: Settings):
    from worker.controller import Controller

    return Controller(settings)


def new_account(db: Database, deposit_usd: str | None = None) -> str:
    with db.session() as session:
        account, _ = create_account(session, f"a-{time.time_ns()}", open_jobs_limit=1)
        if deposit_usd:
            billing.deposit(session, account, billing.to_cents(deposit_usd), int(time.time()))
        return account.id


def put_job(db: Database, account_id: str, *, rate: float = 0.40, max_charge: float = 3.00, minimum: float = 0.50,
            status: str = "queued", created_at: int | None = None, **values) -> str:
    """A job as create leaves it: its spec and its quote's per_token (the only part billing reads)."""
    now = int(time.time())
    job = Job(
        id=new_job_id(), account_id=account_id, model=MODEL, status=status, created_at=created_at or now,
        created_ns=time.time_ns(), seed=0, updated_at=now, result_files=[],
        spec={"model": MODEL, "method_type": "supervised", "adapter": "lora", "max_seq_length": 512},
        quote={"per_token": {"trained_usd_per_mtok": rate, "minimum_usd": minimum, "max_charge_usd": max_charge}},
        **{"training_file": "file-missing", **values},
    )
    with db.session() as session:
        session.add(job)
    return job.id


def start_with_hold(db: Database, job_id: str, *, lease_s: int = 300) -> Started:
    """What `tick` does for a job it starts (jobs.transitions.start), without the run thread (which
    would train). `lease_s=-1`: a run whose lease has lapsed, as after its controller died."""
    owner = f"test.{time.time_ns()}"
    with db.session() as session:
        assert transitions.start(session, job_id, int(time.time()), owner=owner, lease_s=lease_s,
                                 billing_enabled=True).ok
        return Started(job_id, owner, session.get(Job, job_id).attempts)


def succeeded(tokens: int) -> AttemptResult:
    return AttemptResult("succeeded", result={"trained_tokens": tokens})


def write_adapter(settings: Settings, job_id: str) -> str:
    store = open_object_store(settings.resolved_storage_url())
    prefix = f"runs/{job_id}/adapter"
    store.put_bytes(f"{prefix}/adapter_model.safetensors", b"\0" * 64)
    store.put_bytes(f"{prefix}/adapter_config.json", orjson.dumps({"peft_type": "LORA", "r": 8}))
    return prefix


def money(db: Database, account_id: str) -> tuple[float, float]:
    with db.session() as session:
        credit = billing.credit(session, account_id)
    return billing.to_usd(credit.balance_cents), billing.to_usd(credit.held_cents)


def ledger(db: Database, account_id: str) -> list[tuple[str, int]]:
    with db.session() as session:
        rows = session.scalars(select(LedgerEntry).where(LedgerEntry.account_id == account_id)
                               .order_by(LedgerEntry.seq)).all()
        return [(e.kind, e.amount_cents) for e in rows]


def job_row(db: Database, job_id: str) -> Job:
    with db.session() as session:
        return session.get(Job, job_id)


def event_messages(db: Database, job_id: str) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)))


# -- the credit check at start ---------------------------------------------------------------
def test_job_without_credit_fails_insufficient_quota_with_nothing_run(own):
    settings, db = own
    poor, short = new_account(db), new_account(db, "0.49")
    jobs = [put_job(db, poor, max_charge=0.50), put_job(db, short, max_charge=0.50)]
    ctl = controller(settings)
    assert ctl.tick() == []
    assert ctl.active_runs() == []
    for job_id in jobs:
        job = job_row(db, job_id)
        assert (job.status, job.error["code"], job.started_at, job.attempts) == ("failed", "insufficient_quota", None, 0)
        assert "0.50 USD" in job.error["message"] and job.charge is None
        assert "Fine-tuning job started." not in event_messages(db, job_id)
        assert event_messages(db, job_id)[-1].startswith("insufficient_quota: Not enough credit")
    assert ledger(db, poor) == [] and ledger(db, short) == [("deposit", 49)]
    assert money(db, short) == (0.49, 0.0)


def test_funded_job_holds_its_most_and_a_training_failure_is_not_charged(own):
    """Exactly enough credit starts the job; its run fails at once (its file's object is
    missing): `training_failed`, a platform failure, releases the hold and charges nothing."""
    settings, db = own
    account = new_account(db, "0.50")
    job_id = put_job(db, account, max_charge=0.50)
    ctl = controller(settings)
    assert ctl.tick() == [job_id]
    ctl.runs[job_id][1].join(timeout=60)
    job = job_row(db, job_id)
    assert (job.status, job.error["code"], job.attempts) == ("failed", "training_failed", 1)
    assert ledger(db, account) == [("deposit", 50), ("hold", -50), ("release", 50)]
    assert money(db, account) == (0.50, 0.0)
    assert job.charge == {"usd": 0.0, "cents": 0, "basis": "not_charged", "trained_tokens": 0,
                          "trained_usd_per_mtok": 0.40}


# -- the charge when a job succeeds ----------------------------------------------------------
@pytest.mark.parametrize("tokens,rate,max_charge,cents,basis", [
    (3_456_789, 0.80, 3.00, 277, "trained_tokens"),  # 2.7654312 USD
    (1_812_500, 2.00, 4.00, 363, "trained_tokens"),  # 3.625 rounds half up, not to even
    (1_234_567, 0.40, 3.00, 50, "minimum"),  # 0.49 USD is under the 0.50 minimum
    (10_000_000, 0.40, 3.50, 350, "max_charge"),  # 4.00 USD is over the quote's most
])
def test_succeeded_job_is_charged_rate_times_trained_tokens_to_the_cent(own, tokens, rate, max_charge, cents, basis):
    settings, db = own
    account = new_account(db, "10.00")
    job_id = put_job(db, account, rate=rate, max_charge=max_charge)
    ctl = controller(settings)  # before the job runs: a controller's start requeues runs it does not drive
    run = start_with_hold(db, job_id)
    assert money(db, account) == (10.00, max_charge)
    write_adapter(settings, job_id)
    ctl.runs_work.conclude(run, "supervised", succeeded(tokens))
    job = job_row(db, job_id)
    assert job.status == "succeeded" and job.trained_tokens == tokens
    assert job.charge == {"usd": cents / 100, "cents": cents, "basis": basis, "trained_tokens": tokens,
                          "trained_usd_per_mtok": rate}
    assert ledger(db, account)[-2:] == [("release", int(max_charge * 100)), ("charge", -cents)]
    assert money(db, account) == ((1000 - cents) / 100, 0.0)


def test_adapter_quota_exceeded_is_charged_its_tokens_without_the_minimum(own):
    settings, db = own
    account = new_account(db, "5.00")
    with db.session() as session:
        session.add_all(FineTunedModel(
            id=f"ft:{MODEL}:x:{i:012d}", account_id=account, job_id=f"ftjob-old{i}", base=MODEL, servable=True,
            adapter_prefix=f"runs/old{i}/adapter", files={}, created_at=0, created_ns=i) for i in range(100))
    job_id = put_job(db, account)
    ctl = controller(settings)
    run = start_with_hold(db, job_id)
    write_adapter(settings, job_id)
    ctl.runs_work.conclude(run, "supervised", succeeded(112_345))
    job = job_row(db, job_id)
    assert (job.status, job.error["code"]) == ("failed", "adapter_quota_exceeded")
    assert job.charge["cents"] == 4 and job.charge["basis"] == "trained_tokens"  # 0.044938 USD, no 0.50 minimum
    assert money(db, account) == (4.96, 0.0)


# -- platform failures ------------------------------------------------------------------------
def test_each_platform_failure_leaves_the_balance_unchanged(own):
    settings, db = own
    account = new_account(db, "20.00")
    ctl = controller(settings)

    timed_out = put_job(db, account)
    ctl.runs_work.conclude(start_with_hold(db, timed_out), "supervised", AttemptResult(
        "failed", error_code="time_limit_exceeded", error_message="Training did not finish within 7200 s."))

    interrupted = put_job(db, account, attempts=1)
    start_with_hold(db, interrupted, lease_s=-1)  # its second attempt: a lost run is not retried again
    controller(settings)  # a restarted controller reconciles the run nobody drives

    # Held, then requeued after a lost run, and no capacity for 24 hours: it ran, so job_expired.
    expired = put_job(db, account)
    start_with_hold(db, expired, lease_s=-1)
    ctl.reconcile()
    with db.session() as session:
        session.get(Job, expired).waiting_since = int(time.time()) - DAY - 60
    assert money(db, account) == (20.00, 3.00)
    ctl.tick()

    for job_id, code in ((timed_out, "time_limit_exceeded"), (interrupted, "platform_interrupted"),
                         (expired, "job_expired")):
        job = job_row(db, job_id)
        assert (job.status, job.error["code"], job.charge["basis"], job.charge["cents"]) == (
            "failed", code, "not_charged", 0)
    assert money(db, account) == (20.00, 0.0)
    assert [k for k, _ in ledger(db, account)].count("charge") == 0


# -- restarts ---------------------------------------------------------------------------------
def test_charge_is_applied_once_across_a_controller_restart(own):
    settings, db = own
    account = new_account(db, "10.00")
    job_id = put_job(db, account, rate=0.80)
    start_with_hold(db, job_id, lease_s=-1)
    ctl = controller(settings)  # restarted mid-run: its start requeues the run whose lease lapsed
    assert job_row(db, job_id).status == "queued"
    run = start_with_hold(db, job_id)  # its next tick starts it again and keeps its one hold
    assert ledger(db, account) == [("deposit", 1000), ("hold", -300)]

    write_adapter(settings, job_id)
    ctl.runs_work.conclude(run, "supervised", succeeded(2_000_000))  # 1.60 USD
    again = controller(settings)  # restarted after the job ended: nothing to reconcile
    with pytest.raises(LeaseLost):  # a replayed end proves a lease the job no longer has
        again.runs_work.conclude(run, "supervised", succeeded(2_000_000))
    with db.session() as session:
        billing.settle(session, session.get(Job, job_id), int(time.time()))
    assert ledger(db, account) == [("deposit", 1000), ("hold", -300), ("release", 300), ("charge", -160)]
    assert money(db, account) == (8.40, 0.0)


# -- through the API, billing on ----------------------------------------------------------------
@pytest.fixture(scope="module")
def bapi(admin_api):
    return admin_api


@pytest.fixture(scope="module")
def bdb(bapi):
    database = Database(bapi.settings.resolved_database_url(), migrate=False)
    yield database
    database.dispose()


def admin(api, method: str, path: str, key: str | None = ADMIN_KEY, **body) -> httpx.Response:
    return httpx.request(method, f"{api.base_url}/gridline/admin/accounts/{path}", json=body or None,
                         headers={"Authorization": f"Bearer {key}"} if key else {})


def test_admin_api_needs_its_own_key(bapi, apis):
    account_id, key = bapi.create_account()
    for wrong in (None, "wrong", key):
        r = admin(bapi, "GET", account_id, key=wrong)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    # Without an admin key configured the API does not exist.
    plain = apis("sqlite")
    r = admin(plain, "GET", "anyone")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")


def test_admin_credits_balance_limits_and_ledger(bapi):
    account_id, _ = bapi.create_account()
    fresh = admin(bapi, "GET", account_id).json()
    assert (fresh["balance_usd"], fresh["limits"]) == (0.0, {"open_jobs": 1, "usd_per_day": 100.0, "models": 100})

    r = admin(bapi, "POST", f"{account_id}/credits", usd="25.50", note="invoice 7", idempotency_key="inv-7")
    assert r.status_code == 200, r.text
    again = admin(bapi, "POST", f"{account_id}/credits", usd="25.50", idempotency_key="inv-7").json()
    assert again["balance_usd"] == again["available_usd"] == 25.50 and again["held_usd"] == 0.0
    assert again["limits"]["open_jobs"] == 3  # the first deposit makes the account an established one
    for bad in ("1.234", "-5", "abc", 0):
        r = admin(bapi, "POST", f"{account_id}/credits", usd=bad)
        assert (r.status_code, r.json()["error"]["param"]) == (400, "usd"), bad

    r = admin(bapi, "POST", f"{account_id}/limits", open_jobs=5, usd_per_day="12.00", models=7)
    assert r.json()["limits"] == {"open_jobs": 5, "usd_per_day": 12.0, "models": 7}
    admin(bapi, "POST", f"{account_id}/credits", usd=1)  # an explicit limit stays
    name = admin(bapi, "GET", account_id).json()["name"]
    by_name = admin(bapi, "GET", name).json()
    assert by_name["limits"]["open_jobs"] == 5 and by_name["balance_usd"] == 26.50

    page = admin(bapi, "GET", f"{account_id}/ledger?limit=1").json()
    assert page["has_more"] is True and [(e["kind"], e["usd"]) for e in page["data"]] == [("deposit", 1.0)]
    rest = admin(bapi, "GET", f"{account_id}/ledger?after={page['data'][0]['id']}").json()
    assert [(e["kind"], e["usd"], e["note"]) for e in rest["data"]] == [("deposit", 25.5, "invoice 7")]
    assert admin(bapi, "GET", "acct-nobody").status_code == 404


def test_concurrent_creates_never_exceed_the_open_job_limit_then_the_model_limit(bapi, bdb):
    account_id, key = bapi.create_account()
    admin(bapi, "POST", f"{account_id}/credits", usd="50")  # 1 -> 3 open jobs
    client = bapi.client(key)
    train = upload(client, TRAIN).id

    results = create_jobs_in_parallel(client, 8, model=MODEL, training_file=train)
    created = [r for r in results if not isinstance(r, Exception)]
    assert len(created) == 3
    assert all(r.body["code"] == "limit_exceeded" and r.body["limit"] == {"limit": 3, "current": 3}
               for r in results if isinstance(r, Exception))
    with bdb.session() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.account_id == account_id)) == 3

    # Models: each open job reserves a slot.
    admin(bapi, "POST", f"{account_id}/limits", open_jobs=10, models=3)
    with pytest.raises(openai.RateLimitError) as info:
        client.fine_tuning.jobs.create(model=MODEL, training_file=train)
    assert info.value.body["limit"] == {"limit": 3, "current": 3} and "fine-tuned models" in info.value.body["message"]
    for job in created:
        client.fine_tuning.jobs.cancel(job.id)
    assert client.fine_tuning.jobs.create(model=MODEL, training_file=train).status == "queued"


def test_cancelled_job_is_charged_nothing_and_shows_its_charge(bapi, bdb):
    account_id, key = bapi.create_account()
    admin(bapi, "POST", f"{account_id}/credits", usd="5")
    client = bapi.client(key)
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=upload(client, TRAIN).id)
    max_charge = job.model_extra["gridline"]["quote"]["per_token"]["max_charge_usd"]
    start_with_hold(bdb, job.id)
    assert admin(bapi, "GET", account_id).json()["held_usd"] == max_charge
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.model_extra["gridline"]["charge"]["basis"] == "not_charged"
    summary = admin(bapi, "GET", account_id).json()
    assert (summary["balance_usd"], summary["held_usd"], summary["usage"]["charged_usd"]) == (5.0, 0.0, 0.0)


def test_day_limit_refuses_and_resets_at_the_utc_day_boundary(bapi, bdb):
    account_id, key = bapi.create_account()
    admin(bapi, "POST", f"{account_id}/limits", open_jobs=10, usd_per_day="1.00")
    train = upload(bapi.client(key), TRAIN).id
    clock = {"now": 1_800_000_000 - 1_800_000_000 % DAY + DAY - 120}  # 23:58 UTC
    state = AppState(settings=bapi.settings, db=bdb, store=open_object_store(bapi.settings.resolved_storage_url()),
                     now=lambda: clock["now"])
    with bdb.session() as session:
        account = session.get(Account, account_id)

    def create():
        return create_job(state, account, {"model": MODEL, "training_file": train})

    first, second = create(), create()  # 0.50 USD each at most: the minimum
    assert first.gridline.quote["per_token"]["max_charge_usd"] == 0.50
    with pytest.raises(RateLimited) as info:
        create()
    assert info.value.body()["error"]["limit"] == {"limit": 1.0, "current": 1.0}
    admin(bapi, "POST", f"{account_id}/credits", usd="100")  # a deposit does not raise it
    with pytest.raises(RateLimited):
        create()
    clock["now"] += 119  # 23:59:59
    with pytest.raises(RateLimited):
        create()
    clock["now"] += 1  # 00:00:00 UTC
    assert create().status == "validating_files"
    for job in (first, second):
        cancel_job(state, account, job.id)
