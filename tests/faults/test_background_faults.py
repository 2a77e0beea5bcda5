"""Every kind of background work beside training survives the faults its runs survive, with real
processes, two accounts, on PostgreSQL: batches, eval runs, merges, distills and webhook deliveries.

- SIGKILL of the whole `openft serve` process group while a batch, a merge, a distill and a
  webhook delivery are all in flight (each seen in flight in the database just before the kill),
  then a restart on the same data: the batch ends once with every custom_id exactly once in its
  output or error file, the merge ends `succeeded` once with the digests of an uninterrupted merge
  of the same adapter, the distilled files are recorded once, and every webhook event is
  delivered at least once and recorded once.
- `ray.kill` of the controller actor with a batch and a merge in flight: Ray restarts it, the
  leases of the dead one lapse and hand over, and both end once.
- `ray.kill` of the controller actor mid-eval-run on PostgreSQL, beside another account's queued
  run: the sampling run is handed over and ends once, every item recorded exactly once.
- PostgreSQL restarted with a batch and a merge in flight: both ride through and end once.

Each test records the kinds that survived (`record_property`), which bench/faults.py counts.
Waits are on rows, events and files, never fixed sleeps. Data is tiny: stand-in bases, a batch of
a few hundred short completions, a 40-result distillation, one stand-in adapter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tempfile
from pathlib import Path

import orjson
import pytest
from sqlalchemy import func, select

from catalog.bases import get_base
from merge.run import run_merge
from merge.worker import merge_request
from openft.settings import Settings
from storage.db import Database
from storage.models import Account, Batch, EvalOutputItem, EvalRun, File, FineTunedModel, Job, Merge, WebhookAttempt, \
    WebhookDelivery
from storage.objects import open_object_store
from tests.conftest import LOOPBACK_RECEIVERS, free_port
from tests.factories import batch_request_line, db_ft_model, distill_files, jsonl, random_adapter
from tests.faults.test_faults import _env, _kill_service, _openft, _serve
from tests.utils.polling import until
from tests.utils.webhook_receiver import Receiver

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("ray_cluster")]

BASE = get_base("qwen2.5-0.5b-instruct")
LINES = 3000  # a batch long enough to be mid-run when the fault lands (a stand-in answers ~150 lines/s), short enough to run twice
ENDED = ("completed", "failed", "expired", "cancelled")


# -- helpers --------------------------------------------------------------------------------------
def read(db: Database, query):
    """`query(session)`'s answer, through a PostgreSQL restart (this suite's own, or another's)."""

    def once():
        with db.session() as session:
            return query(session)

    return db.retrying(once, budget_s=120, what="the test's read")


def batch_file(client, n: int, prefix: str = "req"):
    lines = [batch_request_line(f"{prefix}-{i:05d}", model=BASE.id, max_tokens=16, temperature=0) for i in range(n)]
    return client.files.create(file=(f"{prefix}.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")


def batch_in_progress(db: Database, batch_id: str) -> bool:
    """Driven and past its first lines: the engine is generating."""
    row = read(db, lambda s: s.get(Batch, batch_id))
    return row.status == "in_progress" and row.lease_owner is not None and 0 < (row.request_counts or {}).get(
        "completed", 0) < row.request_counts["total"]


def merge_in_flight(db: Database, store, merge_id: str) -> bool:
    """Leased, running, and writing its export (the base's small files are copied before the shards)."""
    row = read(db, lambda s: s.get(Merge, merge_id))
    return row.status == "running" and row.lease_owner is not None and any(store.list(row.export_prefix + "/"))


def the_merge(db: Database, account_id: str) -> Merge | None:
    return read(db, lambda s: s.scalars(select(Merge).where(Merge.account_id == account_id)).one_or_none())


def assert_batch_ended_once(client, db: Database, batch_id: str, custom_ids: list[str], status: str,
                            attempts: int | None = None) -> None:
    done = until(lambda: (b := client.batches.retrieve(batch_id)).status in ENDED and b, f"end of {batch_id}", 600)
    assert done.status == status, done.errors
    row = read(db, lambda s: s.get(Batch, batch_id))
    assert row.lease_owner is None
    if attempts is not None:
        assert row.attempts == attempts
    seen = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id:
            seen += [orjson.loads(line)["custom_id"] for line in client.files.content(file_id).content.splitlines()
                     if line.strip()]
    assert sorted(seen) == sorted(custom_ids)  # every custom_id exactly once, in one file or the other
    assert done.request_counts.total == len(custom_ids)


def assert_merged_once(client, db: Database, settings: Settings, account_id: str, model: str, attempts: int) -> None:
    path = f"/gridline/adapters/{model}/merged"
    done = until(lambda: (m := client.get(path, cast_to=object))["status"] in ("succeeded", "failed") and m,
                 f"end of the merge of {model}", 600)
    assert done["status"] == "succeeded", done["error"]
    row = the_merge(db, account_id)  # one merge, ended once
    assert (row.status, row.attempts, row.lease_owner) == ("succeeded", attempts, None)
    store = open_object_store(settings.resolved_storage_url())
    # The same adapter merged without a fault, into a prefix of its own, in this process's Ray.
    adapter_prefix = read(db, lambda s: s.get(FineTunedModel, model).adapter_prefix)
    request = merge_request(settings, store, row, adapter_prefix)
    reference = run_merge(dataclasses.replace(request, export_prefix=row.export_prefix + "-reference"), store)
    assert {f["path"]: f["sha256"] for f in done["files"]} == {f["path"]: f["sha256"] for f in reference.files}
    for entry in done["files"]:  # and the stored bytes are what the status lists
        assert hashlib.sha256(store.get_bytes(f"{row.export_prefix}/{entry['path']}")).hexdigest() == entry["sha256"]


def ft_model(settings: Settings, db: Database, account_id: str) -> str:
    """A registered stand-in fine-tune of the account (a real peft adapter), as a job registers it."""
    store = open_object_store(settings.resolved_storage_url())
    return db_ft_model(db, store, account_id, random_adapter(BASE, settings.model_cache_dir, seed=7))


# -- SIGKILL of the whole service ---------------------------------------------------------------------
def test_sigkill_mid_batch_merge_distill_and_delivery_then_a_restart_ends_each_once(fresh_pg_url, record_property):
    data_dir = Path(tempfile.mkdtemp(prefix="oftbg-"))
    env = {**_env(data_dir, fresh_pg_url), "OPENFT_WEBHOOK_TIMEOUT_SECONDS": "30", "OPENFT_WEBHOOK_LEASE_SECONDS": "40",
           "OPENFT_WEBHOOK_BACKOFF_SECONDS": "1",
           # Its receivers listen on 127.0.0.1, which webhook targets may reach only when allowed (issue 24).
           "OPENFT_WEBHOOK_ALLOWED_NETWORKS": orjson.dumps(LOOPBACK_RECEIVERS["webhook_allowed_networks"]).decode()}
    settings = Settings(data_dir=data_dir, database_url=fresh_pg_url, model_source="standin")
    alice = _openft(env, "accounts", "create", "alice", "--open-jobs", "3").strip().splitlines()[-1]
    _openft(env, "accounts", "credit", "alice", "50.00")
    bob = _openft(env, "accounts", "create", "bob", "--open-jobs", "3").strip().splitlines()[-1]  # no credit
    db = Database(fresh_pg_url, migrate=False)
    bob_id = read(db, lambda s: s.scalar(select(Account.id).where(Account.name == "bob")))
    model = ft_model(settings, db, bob_id)
    receiver = Receiver(delays=[300]).start()  # holds the first POST until the service is killed
    port = free_port()
    server, base_url = _serve(env, port)
    try:
        import openai

        a, b = (openai.OpenAI(base_url=base_url, api_key=key, max_retries=2) for key in (alice, bob))
        hook = a.webhooks.create(name="all", url=receiver.url, event_types=[
            "batch.completed", "batch.cancelled", "batch.failed", "batch.expired"])
        receiver.secret = hook.signing_secret

        # The files first; then in flight, one after the other: a batch, a delivery, a distill, a merge.
        big, small = batch_file(a, LINES), batch_file(a, 3, prefix="small")
        results, requests, _ = distill_files("openai", 40, seed=3)
        b.files.create(file=("requests.jsonl", io.BytesIO(requests)), purpose="batch")
        res = b.files.create(file=("results.jsonl", io.BytesIO(results)), purpose="batch_output")
        batch = a.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h")
        until(lambda: batch_in_progress(db, batch.id), "the batch mid-run", 600, 0.2)
        waiting = a.batches.create(input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h")
        a.batches.cancel(waiting.id)  # closed by the worker beside the running batch: its event is delivered
        receiver.wait_for(1, timeout=120)
        job = b.fine_tuning.jobs.create(model=BASE.id, training_file=res.id)
        until(lambda: read(db, lambda s: s.get(Job, job.id).lease_owner), "the distill's lease", 120, 0.1)
        assert b.post(f"/gridline/adapters/{model}/merged", cast_to=object)["status"] == "queued"
        store = open_object_store(settings.resolved_storage_url())
        merge_id = until(lambda: (m := the_merge(db, bob_id)) and m.id, "the merge's row")
        until(lambda: merge_in_flight(db, store, merge_id), "the merge mid-write", 120, 0.05)

        def in_flight(session) -> dict:
            return {"batch": session.get(Batch, batch.id).status == "in_progress",
                    "merge": session.get(Merge, merge_id).status == "running",
                    "distill": session.get(Job, job.id).reason == "distilling",
                    "delivery": session.scalar(select(func.count()).select_from(WebhookDelivery).where(
                        WebhookDelivery.status == "pending", WebhookDelivery.lease_owner.is_not(None))) == 1}

        assert read(db, in_flight) == dict.fromkeys(("batch", "merge", "distill", "delivery"), True)
        _kill_service(server, data_dir)

        server, base_url = _serve(env, port)
        a, b = (openai.OpenAI(base_url=base_url, api_key=key, max_retries=2) for key in (alice, bob))
        assert_batch_ended_once(a, db, batch.id, [f"req-{i:05d}" for i in range(LINES)], "completed", attempts=2)
        assert_batch_ended_once(a, db, waiting.id, [f"small-{i:05d}" for i in range(3)], "cancelled")
        record_property("survived:batch", 1)

        assert_merged_once(b, db, settings, bob_id, model, attempts=2)
        record_property("survived:merge", 1)

        done = until(lambda: (j := b.fine_tuning.jobs.retrieve(job.id)).status in ("failed", "succeeded") and j,
                     "the distilled job's end", 600)
        # Distilled and admitted once, then refused at its start: bob has no credit (no run needed here).
        assert (done.status, done.error.code) == ("failed", "insufficient_quota")
        derived = done.model_extra["gridline"]["derived_from"]
        made = read(db, lambda s: s.scalars(select(File).where(File.account_id == bob_id,
                                                               File.purpose == "fine-tune")).all())
        assert sorted(f.id for f in made) == sorted(filter(None, (derived["training_file"], derived["validation_file"])))
        assert (done.training_file, done.validation_file) == (derived["training_file"], derived["validation_file"])
        assert all(f.derived_from["results_file"] == res.id for f in made)
        assert read(db, lambda s: s.get(Job, job.id).distill_attempts) == 2
        messages = [e.message for e in b.fine_tuning.jobs.list_events(job.id, limit=100)]
        assert messages.count("Distillation started.") == 2 and sum(m.startswith("Distilled ") for m in messages) == 1
        record_property("survived:distill", 1)

        # Every event: delivered at least once, recorded once (one 2xx attempt in the log).
        def settled(session):
            rows = session.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == hook.id)).all()
            return len(rows) == 2 and all(r.status == "delivered" for r in rows) and rows

        deliveries = until(lambda: read(db, settled), "every delivery delivered", 180)
        got = {r.event.id for r in receiver.events() if r.event is not None}
        for delivery in deliveries:
            assert delivery.event_id in got
            log = read(db, lambda s: s.scalars(select(WebhookAttempt).where(
                WebhookAttempt.delivery_id == delivery.id)).all())
            assert [a.status_code for a in log if a.status_code and a.status_code < 300] == [200]
        held = next(d for d in deliveries if d.event_type == "batch.cancelled")
        assert held.attempts >= 2  # its first claim died with the service
        record_property("survived:delivery", 1)
    finally:
        _kill_service(server, data_dir)
        receiver.stop()
        db.dispose()


# -- ray.kill of the controller, and a PostgreSQL restart ----------------------------------------------
def _batch_and_merge(api, db: Database):
    """Alice's batch mid-run and bob's merge mid-write, on the deployment `api`: (clients, ids)."""
    alice_id, alice = api.create_account()
    bob_id, bob = api.create_account()
    a, b = api.client(alice), api.client(bob)
    model = ft_model(api.settings, db, bob_id)
    big = batch_file(a, LINES)
    batch = a.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h")
    until(lambda: batch_in_progress(db, batch.id), "the batch mid-run", 600, 0.2)
    assert b.post(f"/gridline/adapters/{model}/merged", cast_to=object)["status"] == "queued"
    store = open_object_store(api.settings.resolved_storage_url())
    merge_id = until(lambda: (m := the_merge(db, bob_id)) and m.id, "the merge's row")
    until(lambda: merge_in_flight(db, store, merge_id), "the merge mid-write", 120, 0.05)
    return a, b, batch.id, bob_id, model


def test_ray_kill_of_the_controller_mid_batch_and_mid_merge_hands_both_over(service, record_property):
    import ray

    from tests.faults.test_faults import _restarted_id

    api, handle = service("bgkill")
    db = Database(api.settings.resolved_database_url(), migrate=False)
    try:
        a, b, batch_id, bob_id, model = _batch_and_merge(api, db)
        before = ray.get(handle.controller_id.remote())
        ray.kill(handle, no_restart=False)  # its threads die with it; Ray restarts the actor
        until(lambda: _restarted_id(handle, before), "the controller's restart", 120)
        assert_batch_ended_once(a, db, batch_id, [f"req-{i:05d}" for i in range(LINES)], "completed", attempts=2)
        record_property("survived:batch", 1)
        assert_merged_once(b, db, api.settings, bob_id, model, attempts=2)
        record_property("survived:merge", 1)
    finally:
        db.dispose()


def completions_eval_run(api, n: int):
    """A fresh account's completions eval run of `n` items on the stand-in base: (client, eval id, run id)."""
    _, key = api.create_account()
    client = api.client(key)
    schema = {"type": "object", "properties": {"q": {"type": "string"}, "a": {"type": "string"}}, "required": ["q", "a"]}
    made = client.evals.create(
        data_source_config={"type": "custom", "item_schema": schema, "include_sample_schema": True},
        testing_criteria=[{"type": "string_check", "name": "eq", "input": "{{sample.output_text}}",
                           "reference": "{{item.a}}", "operation": "eq"}])
    items = [{"item": {"q": f"Ticket {i}: which team should answer it, and why?", "a": "billing"}} for i in range(n)]
    run = client.evals.runs.create(made.id, data_source={
        "type": "completions", "model": BASE.id, "source": {"type": "file_content", "content": items},
        "input_messages": {"type": "template", "template": [{"role": "user", "content": "{{item.q}}"}]},
        "sampling_params": {"max_completion_tokens": 48, "temperature": 0, "seed": 0}})
    return client, made.id, run.id


def assert_eval_run_ended_once(client, db: Database, eval_id: str, run_id: str, n: int, attempts: int) -> None:
    done = until(lambda: (r := client.evals.runs.retrieve(run_id, eval_id=eval_id)).status in (
        "completed", "failed", "canceled") and r, f"end of {run_id}", 600)
    assert done.status == "completed", done.error
    row = read(db, lambda s: s.get(EvalRun, run_id))
    assert (row.attempts, row.lease_owner) == (attempts, None)
    indexes = read(db, lambda s: s.scalars(select(EvalOutputItem.item_index).where(EvalOutputItem.run_id == run_id)).all())
    assert sorted(indexes) == list(range(n))  # every item recorded exactly once
    assert done.result_counts.total == n


def test_ray_kill_of_the_controller_mid_eval_run_hands_it_over(service, fresh_pg_url, record_property):
    import ray

    from tests.faults.test_faults import _restarted_id

    api, handle = service("evkill", database_url=fresh_pg_url)
    db = Database(api.settings.resolved_database_url(), migrate=False)
    try:
        c, eval_id, run_id = completions_eval_run(api, LINES)
        d, other_eval, queued = completions_eval_run(api, 3)  # another account's, waiting for the engine's slot
        until(lambda: (r := read(db, lambda s: s.get(EvalRun, run_id))).status == "in_progress" and r.lease_owner,
              "the eval run mid-sampling", 600, 0.1)
        before = ray.get(handle.controller_id.remote())
        ray.kill(handle, no_restart=False)
        until(lambda: _restarted_id(handle, before), "the controller's restart", 120)
        assert_eval_run_ended_once(c, db, eval_id, run_id, LINES, attempts=2)
        assert_eval_run_ended_once(d, db, other_eval, queued, 3, attempts=1)
        record_property("survived:eval_run", 1)
    finally:
        db.dispose()


def test_postgres_restarted_mid_batch_and_mid_merge_both_end_once(service, private_pg, record_property):
    api, _ = service("bgpg", database_url=private_pg.url)
    db = Database(api.settings.resolved_database_url(), migrate=False)
    try:
        a, b, batch_id, bob_id, model = _batch_and_merge(api, db)
        private_pg.restart()
        assert_batch_ended_once(a, db, batch_id, [f"req-{i:05d}" for i in range(LINES)], "completed")
        record_property("survived:batch", 1)
        assert_merged_once(b, db, api.settings, bob_id, model, attempts=1)  # the holder rode through
        record_property("survived:merge", 1)
    finally:
        db.dispose()
