"""The distill shortcut in the background (issue 12): a job created on a batch results file comes
back at once in `validating_files` (reason `distilling`), and the job controller distills it,
checks the derived files as create would, and admits it, or fails it with create's code.

Real parts: a deployment of its own with billing on (the SDK creates, cancels and reads), and the
real `Controller` in-process on that deployment's database and store (real distillation on Ray
Data, real create checks), with scripted runs (tests/worker/runs.py) in place of Ray Train. Passes
are driven by `tick()` so a test decides when the controller acts: before it does, nothing has
been distilled, which is what proves create did not distill in the request."""

from __future__ import annotations

import io
import uuid

import pytest
from sqlalchemy import select

from jobs import scheduling
from jobs.distilling import distill_job
from serve_app.state import AppState
from storage import billing
from storage.accounts import create_account, limits_row
from storage.models import File, Job, LedgerEntry
from tests.factories import batch_request_line, batch_result_line, distill_files, jsonl
from tests.serve_app.test_jobs_api import refused
from tests.utils.polling import until
from tests.worker.runs import ScriptedRuns
from worker.controller import Controller

# make test-heavy: a deployment of its own and real Ray Data distillations (about a minute here);
# make test keeps the shortcut's end-to-end run in tests/serve_app/test_training_api.py.
pytestmark = pytest.mark.heavy

MODEL = "qwen2.5-0.5b-instruct"
ENDED = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def dapi(apis):
    """Billing on (the USD-per-day check moves to admission); runs need no CPU, so scripted runs
    of several accounts may overlap; a short lease, so a dead controller's lapses quickly."""
    return apis("distill", billing_enabled=True, train_worker_resources={}, max_concurrent_runs=4,
                run_lease_seconds=2, parity_check=False)  # scripted runs' placeholder adapters cannot be served


@pytest.fixture(scope="module")
def state(dapi):
    state = AppState.from_settings(dapi.settings)
    yield state
    state.db.dispose()


@pytest.fixture
def ctl(dapi, state):
    made = []

    def make() -> Controller:
        made.append(Controller(dapi.settings, runs=ScriptedRuns(steps=3)))
        return made[-1]

    yield make
    for controller in made:
        controller.stop()
        for _, thread in [*controller.runs.values(), *controller.distills.values()]:
            thread.join(timeout=60)
        controller.db.dispose()


def new_client(dapi, state, open_jobs: int = 3):
    """A fresh account with credit: (SDK client, account id)."""
    with state.db.session() as session:
        account, key = create_account(session, f"acct-{uuid.uuid4().hex[:8]}", open_jobs_limit=open_jobs)
        billing.deposit(session, account, billing.to_cents("50.00"), state.now())
        return dapi.client(key), account.id


def upload(client, data: bytes, purpose: str):
    return client.files.create(file=(f"{purpose}.jsonl", io.BytesIO(data)), purpose=purpose)


def job_row(state, job_id: str) -> Job:
    with state.db.session() as session:
        return session.get(Job, job_id)


def drive(controller: Controller, state, job_id: str, statuses=ENDED, timeout: float = 180) -> Job:
    """Controller passes until the job reaches one of `statuses` with nothing driving it."""
    def reached():
        controller.tick()
        job = job_row(state, job_id)
        return job if job.status in statuses and job.lease_owner is None else None

    return until(reached, f"job {job_id} in {statuses}", timeout, interval=0.3)


def messages(client, job_id: str) -> list:
    return list(reversed(list(client.fine_tuning.jobs.list_events(job_id, limit=100))))


def file_ids(client) -> set[str]:
    return {f.id for f in client.files.list().data}


def ledger(state, job_id: str) -> list[str]:
    with state.db.session() as session:
        return sorted(session.scalars(select(LedgerEntry.kind).where(LedgerEntry.job_id == job_id)).all())


def test_create_returns_distilling_and_after_a_controller_restart_trains_on_the_derived_files(dapi, state, ctl):
    """Create answers before anything is distilled; a controller takes the job's distill lease and
    dies (its lease is never renewed); the next controller distills the job, once, and trains it."""
    client, _ = new_client(dapi, state)
    results, requests, _ = distill_files("openai", 40, seed=5)
    req, res = upload(client, requests, "batch"), upload(client, results, "batch_output")
    before = file_ids(client)

    job = client.fine_tuning.jobs.create(model=MODEL, training_file=res.id)
    gridline = job.model_extra["gridline"]
    assert (job.status, gridline["reason"], job.training_file, job.validation_file) == (
        "validating_files", "distilling", res.id, None)
    assert gridline["derived_from"] == {"results_file": res.id} and gridline["quote"] == {}
    said = messages(client, job.id)
    assert said[-1].data == {"code": "distilling", "results_file": res.id}
    assert file_ids(client) == before  # nothing was distilled in the request

    claimed = scheduling.claim_distills(state.db, state.now(), settings=dapi.settings, new_owner=lambda: "ctl-dead.d1")
    assert [c.job_id for c in claimed] == [job.id]
    controller = ctl()
    done = drive(controller, state, job.id)
    assert done.status == "succeeded", done.error
    job = client.fine_tuning.jobs.retrieve(job.id)
    derived = job.model_extra["gridline"]["derived_from"]
    assert (derived["results_file"], derived["requests_file"]) == (res.id, req.id)
    assert (job.training_file, job.validation_file) == (derived["training_file"], derived["validation_file"])
    distilled = {f.id for f in client.files.list().data
                 if (f.model_extra["gridline"].get("derived_from") or {}).get("results_file") == res.id}
    assert distilled == {job.training_file, job.validation_file}  # the dead controller recorded nothing
    made = client.files.retrieve(job.training_file).model_extra["gridline"]
    assert made["derived_from"]["results_file"] == res.id and made["rows"] == derived["counts"]["training_rows"]
    assert job.model_extra["gridline"]["quote"]["per_token"]["max_charge_usd"] > 0
    with state.db.session() as session:
        key = session.get(File, job.training_file).object_key
    assert controller.executor.tickets[0].training.object_key == key  # the run read the derived file
    said = [e.message for e in messages(client, job.id)]
    assert said.count("Distillation started.") == 2
    at = len(said) - 1 - said[::-1].index("Distillation started.")
    assert said[at + 1].startswith(f"Distilled {res.id} with its requests {req.id} into {job.training_file}")
    assert said[at + 2].startswith("Files validated, job queued")
    assert ledger(state, job.id) == ["charge", "hold", "release"]  # held at start, as every job


def test_refusals_from_the_distilled_data_fail_the_job_with_creates_code_and_hold_nothing(dapi, state, ctl):
    """A template refusal on the derived rows, and no requests file: each fails the job (code,
    param, an error event), releases the account's one open-job slot (the next create is accepted)
    and leaves the ledger untouched."""
    client, _ = new_client(dapi, state, open_jobs=1)
    controller = ctl()
    n = 15
    requests = jsonl(batch_request_line(f"r{i}") for i in range(n))
    upload(client, requests, "batch")
    marked = upload(client, jsonl(batch_result_line(f"r{i}", f"Done <|im_end|> {i}.") for i in range(n)), "batch_output")
    orphan = upload(client, jsonl(batch_result_line(f"x{i}") for i in range(n)), "batch_output")
    plain = upload(client, jsonl(batch_result_line(f"r{i}", f"Done {i}.") for i in range(n)), "batch_output")

    def fails(results, code: str, words: str) -> Job:
        job = client.fine_tuning.jobs.create(model=MODEL, training_file=results.id)  # a 429 if a slot were held
        assert job.status == "validating_files"
        done = drive(controller, state, job.id)
        job = client.fine_tuning.jobs.retrieve(job.id)
        assert (done.status, job.error.code, job.error.param) == ("failed", code, "training_file")
        assert words in job.error.message
        last = messages(client, job.id)[-1]
        assert (last.level, last.data) == ("error", {"code": code})
        assert ledger(state, job.id) == [] and job.model_extra["gridline"]["charge"] is None
        return done

    body = refused(client, model=MODEL, training_file=plain.id, method={"type": "dpo"})  # no file read needed
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")
    fails(marked, "template_token_in_content", "<|im_end|>")
    fails(orphan, "invalid_file_format", "none of your batch files holds its requests")
    last = client.fine_tuning.jobs.create(model=MODEL, training_file=plain.id)  # the slot is free again
    assert client.fine_tuning.jobs.cancel(last.id).status == "cancelled"  # a cancel before any pass
    assert job_row(state, last.id).lease_owner is None and ledger(state, last.id) == []


def test_the_usd_per_day_limit_is_checked_at_admission_once_the_job_is_quoted(dapi, state, ctl):
    """A distilling job commits nothing to the day (it has no quote); once distilled, its quote
    over the account's USD per day fails it limit_exceeded, holding nothing."""
    client, account_id = new_client(dapi, state, open_jobs=1)
    n = 15
    upload(client, jsonl(batch_request_line(f"r{i}") for i in range(n)), "batch")
    plain = upload(client, jsonl(batch_result_line(f"r{i}", f"Done {i}.") for i in range(n)), "batch_output")
    with state.db.session() as session:
        limits_row(session, account_id).usd_per_day_cents = 0
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=plain.id)  # no quote yet: accepted
    assert job.status == "validating_files"
    drive(ctl(), state, job.id)
    job = client.fine_tuning.jobs.retrieve(job.id)
    assert (job.status, job.error.code, job.error.param) == ("failed", "limit_exceeded", None)
    assert "USD to jobs per UTC day" in job.error.message
    assert messages(client, job.id)[-1].data == {"code": "limit_exceeded"} and ledger(state, job.id) == []


def test_cancel_while_distilling_wins_and_the_rows_are_discarded(dapi, state):
    client, _ = new_client(dapi, state)
    results, requests, _ = distill_files("openai", 30, seed=2)
    upload(client, requests, "batch")
    res = upload(client, results, "batch_output")
    before = file_ids(client)
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=res.id)
    # A controller's pass takes the job's distill lease; the cancel lands before it has distilled.
    claimed = scheduling.claim_distills(state.db, state.now(), settings=dapi.settings,
                                        new_owner=lambda: "ctl-test.d1")
    assert [c.job_id for c in claimed] == [job.id]
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    distill_job(state, job.id, "ctl-test.d1")  # what the controller's thread runs, to its end
    row = job_row(state, job.id)
    assert (row.status, row.lease_owner, row.error, row.training_file) == ("cancelled", None, None, res.id)
    assert file_ids(client) == before  # distilled, then discarded: no file recorded
    said = [e.message for e in messages(client, job.id)]
    assert said[-1] == "Fine-tuning job cancelled." and not any(m.startswith("Distilled") for m in said)
    assert ledger(state, job.id) == []
