"""Chains of jobs through the official SDK with the real job controller (issue 26): a job that
continues from an ft: model starts from its weights."""

from __future__ import annotations

import io
import math

import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from tests.serve_app.test_training_api import wait

BASE = "qwen2.5-0.5b-instruct"
SHORT_SFT = {"type": "supervised", "supervised": {"hyperparameters": {
    "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 8, "lora_alpha": 16}}}


@pytest.fixture(scope="module")
def chain_account(training_api, controller):
    _, key = training_api.create_account(open_jobs=3)
    return training_api.client(key)


def test_an_sft_job_on_an_sft_model_starts_from_its_weights(chain_account):
    """Both jobs hold out the same rows (same file, same seed), so the child's eval loss before
    training is the parent's eval loss after it: the child's first forward is the parent's model."""
    client = chain_account
    rows = ticket_splits()[0][:40]
    upload = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")
    parent = wait(client, client.fine_tuning.jobs.create(model=BASE, training_file=upload.id, method=SHORT_SFT,
                                                         seed=5).id)
    assert parent.status == "succeeded", parent.error
    child = client.fine_tuning.jobs.create(model=parent.fine_tuned_model, training_file=upload.id, seed=5,
                                           method={"type": "supervised", "supervised": {"hyperparameters": {
                                               "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3}}})
    assert child.model_extra["gridline"]["parent"]["fine_tuning_job_id"] == parent.id
    child = wait(client, child.id)
    assert child.status == "succeeded", child.error
    before, after = parent.model_extra["gridline"]["result"], child.model_extra["gridline"]["result"]
    assert after["eval_loss_before"] == pytest.approx(before["eval_loss"], rel=1e-5)
    assert not math.isclose(after["eval_loss_before"], before["eval_loss_before"], rel_tol=1e-3)
    assert child.fine_tuned_model != parent.fine_tuned_model
