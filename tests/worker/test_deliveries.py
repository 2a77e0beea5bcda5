"""Webhooks from a real job's end through the real job controller (training deployment): the
controller actor's deliverer thread POSTs the event to a receiver on 127.0.0.1, which verifies it
with the official SDK; another account's endpoint hears nothing. The cheap path (a cancel) runs
in make test; a stand-in job trained to success in make test-heavy."""

from __future__ import annotations

import io
import time

import pytest

from tests.factories import chat_row, jsonl
from webhooks.events import EVENT_TYPES

pytestmark = pytest.mark.usefixtures("ray_cluster")
SFT = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
    "n_epochs": 1, "batch_size": 4, "learning_rate": 1e-3, "lora_rank": 8, "lora_alpha": 16}}}


@pytest.fixture
def two_accounts(training_api, controller, receivers):
    """(client, receiver of its endpoint, endpoint id, the other account's receiver)."""
    _, key = training_api.create_account(open_jobs=3)
    _, other_key = training_api.create_account()
    client, mine, theirs = training_api.client(key), receivers(), receivers()
    hook = client.webhooks.create(name="ci", url=mine.url, event_types=["fine_tuning.job.cancelled",
                                                                        "fine_tuning.job.succeeded"])
    training_api.client(other_key).webhooks.create(name="other", url=theirs.url, event_types=list(EVENT_TYPES))
    mine.secret = hook.signing_secret
    return client, mine, hook.id, theirs


def _job(client, rows: int = 12):
    upload = client.files.create(file=("t.jsonl", io.BytesIO(jsonl([chat_row()] * rows))), purpose="fine-tune")
    return client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=upload.id, method=SFT, seed=0)


def _delivered(client, endpoint_id: str, mine, job_id: str, event_type: str) -> None:
    [got] = mine.wait_for(1, timeout=120)
    assert got.error is None and (got.event.type, got.event.data.id) == (event_type, job_id)
    log = client.get(f"/gridline/webhook_endpoints/{endpoint_id}/deliveries", cast_to=object)
    [delivery] = log["data"]
    assert (delivery["event_id"], delivery["data_id"], delivery["event_type"]) == (got.event.id, job_id, event_type)
    if delivery["status"] != "delivered":  # the receiver answered; the deliverer records it a moment later
        time.sleep(2)
        [delivery] = client.get(f"/gridline/webhook_endpoints/{endpoint_id}/deliveries", cast_to=object)["data"]
    assert delivery["status"] == "delivered" and [a["status_code"] for a in delivery["attempt_log"]] == [200]


def test_a_cancelled_job_reaches_its_accounts_endpoint_through_the_controller(two_accounts):
    client, mine, endpoint_id, theirs = two_accounts
    job = _job(client)
    assert client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    _delivered(client, endpoint_id, mine, job.id, "fine_tuning.job.cancelled")
    assert theirs.events() == []


@pytest.mark.heavy  # a Ray Train run of its own (make test-heavy)
def test_a_succeeded_job_reaches_its_endpoint(two_accounts):
    client, mine, endpoint_id, theirs = two_accounts
    job = _job(client)
    deadline = time.monotonic() + 600
    while client.fine_tuning.jobs.retrieve(job.id).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, "the job did not end in 600 s"
        time.sleep(1)
    assert client.fine_tuning.jobs.retrieve(job.id).status == "succeeded"
    _delivered(client, endpoint_id, mine, job.id, "fine_tuning.job.succeeded")
    assert theirs.events() == []
