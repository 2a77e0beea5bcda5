"""Distillation from a batch (issue 13): a batch's output_file_id names its requests (that batch's own
input file), for POST /v1/files/distill and the job-create shortcut alike; an uploaded results file
keeps the custom_id rule, and each pick is recorded in gridline.derived_from.

The batch is ended through the real transitions with an output file in OpenAI's line shape (the
engine's own run is tests/serve_app/test_batches_e2e.py's): what is tested here is the link."""

from __future__ import annotations

import io
import time

import openai
import pytest

from batches import run as batch_run
from batches import transitions
from batches.scheduling import Claim
from files.distill import requests_file_for
from jobs import distilling
from jobs.distilling import distill_job
from serve_app.state import AppState
from storage import keys
from storage.db import Database
from storage.models import Account, Batch, File, Job
from storage.objects import open_object_store
from tests.factories import batch_request_line, batch_result_line, jsonl

BASE = "qwen2.5-0.5b-instruct"
N = 30
REQUESTS = jsonl(batch_request_line(f"t{i}", [{"role": "user", "content": f"Ticket {i}: my card was charged twice."}],
                                    model=BASE) for i in range(N))
RESULTS = jsonl(batch_result_line(f"t{i}", "billing") for i in range(N))


@pytest.fixture(scope="module")
def state(apis):
    api = apis("sqlite")
    s = api.settings
    st = AppState(s, Database(s.resolved_database_url()),
                  open_object_store(s.resolved_storage_url(), s3_endpoint_url=s.s3_endpoint_url, s3_region=s.s3_region))
    st.api = api
    yield st
    st.db.dispose()


def upload(client, data: bytes, purpose: str):
    return client.files.create(file=("f.jsonl", io.BytesIO(data)), purpose=purpose)


def completed_batch(state, client, input_file_id: str) -> Batch:
    """A batch on `input_file_id` that ends `completed` through its transitions, RESULTS as its output file."""
    batch = client.batches.create(input_file_id=input_file_id, endpoint="/v1/chat/completions", completion_window="24h")
    owner, now = f"ctl-test.b{time.time_ns()}", int(time.time())
    with state.db.session() as session:
        assert transitions.claim(session, batch.id, now, owner=owner, lease_s=60).ok
    with state.db.session() as session:
        assert transitions.begin(session, batch.id, owner, now, billing_enabled=False, quote=None).ok
    ctx = batch_run.Context(state.settings, state.db, state.store)
    with state.db.session() as session:
        row = session.get(Batch, batch.id)
        session.expunge(row)
    key = keys.batch_output(row.account_id, row.id)
    state.store.put_bytes(key, RESULTS)
    output = batch_run._file_row(ctx, row.account_id, key, "out.jsonl", len(RESULTS), "0" * 64, now)
    batch_run._end(ctx, Claim(row.id, owner, None), row, now, [output, None], stopped=None,
                   counts={"total": N, "completed": N, "failed": 0}, usage=None)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id == output.id
    return done


def test_distill_takes_the_batchs_own_input_file(state):
    _, key = state.api.create_account()
    client = state.api.client(key)
    own = upload(client, REQUESTS, "batch")
    batch = completed_batch(state, client, own.id)
    decoy = upload(client, REQUESTS, "batch")  # newer, same custom_ids: the overlap rule would pick it
    out = client.post("/files/distill", body={"results_file": batch.output_file_id}, cast_to=object)
    derived = out["training_file"]["gridline"]["derived_from"]
    assert derived["requests_file"] == own.id and derived["results_file"] == batch.output_file_id
    assert derived["requests_pick"] == {"rule": "batch_input_file", "batch": batch.id}
    assert out["counts"]["training_rows"] + out["counts"]["validation_rows"] == N

    with pytest.raises(openai.BadRequestError) as info:
        client.post("/files/distill", body={"results_file": batch.output_file_id, "requests_file": decoy.id},
                    cast_to=object)
    assert (info.value.body["code"], info.value.body["param"]) == ("invalid_value", "requests_file")

    # An uploaded results file keeps the current rules, and says so.
    uploaded = upload(client, RESULTS, "batch_output")
    given = client.post("/files/distill", body={"results_file": uploaded.id, "requests_file": own.id}, cast_to=object)
    assert given["training_file"]["gridline"]["derived_from"]["requests_pick"] == {"rule": "given"}
    with state.db.session() as session:
        account = session.get(Account, session.get(File, uploaded.id).account_id)
        session.expunge(account)
    picked, pick = requests_file_for(state, account.id, session_file(state, uploaded.id))
    assert picked.id == decoy.id and pick["rule"] == "custom_id_overlap" and pick["matched"] == N
    picked, pick = requests_file_for(state, account.id, session_file(state, batch.output_file_id))
    assert picked.id == own.id and pick["rule"] == "batch_input_file"


def session_file(state, file_id: str) -> File:
    with state.db.session() as session:
        row = session.get(File, file_id)
        session.expunge(row)
        return row


def test_the_job_shortcut_trains_on_rows_from_the_batchs_own_input(state):
    _, key = state.api.create_account()
    client = state.api.client(key)
    own = upload(client, REQUESTS, "batch")
    batch = completed_batch(state, client, own.id)
    upload(client, REQUESTS, "batch")  # a decoy, newer
    job = client.fine_tuning.jobs.create(model=BASE, training_file=batch.output_file_id)
    owner = f"ctl-test.d{time.time_ns()}"
    with state.db.session() as session:
        assert distilling.take(session, job.id, int(time.time()), owner=owner, lease_s=60)
    distill_job(state, job.id, owner)  # what the controller's distill thread runs
    with state.db.session() as session:
        spec = session.get(Job, job.id).spec
    derived = client.fine_tuning.jobs.retrieve(job.id).model_extra["gridline"]["derived_from"]
    assert derived["requests_file"] == own.id and derived["requests_pick"]["rule"] == "batch_input_file"
    assert spec["training_file"] == derived["training_file"] != batch.output_file_id
