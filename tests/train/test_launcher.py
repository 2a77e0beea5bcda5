"""run_training through a real Ray Train TorchTrainer on the session's local Ray (CPU worker):
tokenize with Ray Data, pause, resume in a new Ray Train run, and the adapter files at the end."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

import pytest

from catalog.model_source import ModelSource
from openft.demo_data import ticket_splits, tickets_jsonl
from pipelines.tokenize import build_tokenized
from tests.train.conftest import BASE_ID, MAX_SEQ, make_job
from train.launcher import run_training
from train.progress import FileReporter

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_pause_then_resume_in_a_new_run(store, cache_root, tmp_path):
    data = tickets_jsonl(ticket_splits()[0][:80])
    store.put_bytes("files/acct/file-1", data)
    ref = build_tokenized(
        store.spec(), "files/acct/file-1", hashlib.sha256(data).hexdigest(), BASE_ID, ModelSource("standin"), cache_root, MAX_SEQ, "supervised"
    )
    assert (ref.rows, ref.report["rows"]) == (80, 80)
    control, log = tmp_path / "control", tmp_path / "log.jsonl"
    control.write_text("pause")
    reporter_factory = functools.partial(FileReporter, log, control)
    job = make_job(store, cache_root, train_prefix=ref.prefix, n_epochs=1, run_name="ftjob-test-1")

    paused = run_training(job, reporter_factory, storage_path=str(tmp_path / "ray_train"))

    assert (paused.status, paused.result, paused.error) == ("paused", None, None)
    assert any(k.endswith("/meta.json") for k in store.list(job.checkpoint_prefix))
    control.unlink()

    done = run_training(dataclasses.replace(job, run_name="ftjob-test-2", resume=True), reporter_factory, storage_path=str(tmp_path / "ray_train"))

    assert done.status == "succeeded", done.error
    assert (done.result["eval_rows"], done.result["eval_source"], done.result["steps"]) == (4, "holdout", 19)  # 76 rows / 4
    assert done.result["eval_loss"] < done.result["eval_loss_before"]
    config = json.loads(store.get_bytes(job.output_prefix + "adapter_config.json"))
    assert (config["base_model_name_or_path"], config["r"]) == (BASE_ID, 16)
    assert store.size(job.output_prefix + "adapter_model.safetensors") > 0
    events = [r["message"] for r in FileReporter(log).records() if r["type"] == "event"]
    assert "Training paused at step 0; checkpoint saved." in events and "Resumed from the checkpoint at step 0." in events
