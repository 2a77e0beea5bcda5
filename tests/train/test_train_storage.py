"""Ray Train's own run state lives in the object store (a real SeaweedFS bucket here), under the
job's `keys.train_runs` prefix: every node of a cluster reaches it, which a local directory on the
driver's disk is not, and the reaper deletes it with the job's other copies."""

from __future__ import annotations

import hashlib
import uuid
from functools import partial
from pathlib import Path

import boto3
import pytest

from catalog.model_source import ModelSource
from entrypoints.ray_runtime import ray_temp_dir
from openft.demo_data import ticket_splits, tickets_jsonl
from pipelines.tokenize import build_tokenized
from storage import keys
from storage.objects import open_object_store
from tests.conftest import RAY_SETTINGS
from tests.train.conftest import BASE_ID, MAX_SEQ, make_job
from train.launcher import POINTER, run_training
from train.progress import FileReporter

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _local_copies(root: Path, run_name: str) -> list[Path]:
    """Files or directories under `root` named for the run, outside Ray's temp dir (Ray Train's
    per-node scratch, `<session>/artifacts/`, which Ray removes with its session)."""
    ray_temp = ray_temp_dir(RAY_SETTINGS)
    return [p for p in root.rglob(f"*{run_name}*") if not p.is_relative_to(ray_temp)] if root.exists() else []


@pytest.mark.heavy  # make test-heavy: a Ray Train run of its own (make test's jobs train on the local store)
def test_a_real_run_keeps_its_ray_train_state_in_the_bucket(seaweed, cache_root, tmp_path):
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    store = open_object_store(f"s3://{bucket}/openft", seaweed.endpoint_url)
    data = tickets_jsonl(ticket_splits()[0][:24])
    store.put_bytes("files/a/train", data)
    ref = build_tokenized(store.spec(), "files/a/train", hashlib.sha256(data).hexdigest(), BASE_ID, ModelSource("standin"),
                          cache_root, MAX_SEQ, "supervised")  # fmt: skip
    job = make_job(store, cache_root, job_id="ftjob-trainstate", run_name=f"ftjob-trainstate-{uuid.uuid4().hex[:8]}",
                   n_epochs=1, train_prefix=ref.prefix, output_prefix=keys.adapter("ftjob-trainstate"),
                   checkpoint_prefix=keys.checkpoints("ftjob-trainstate"))  # fmt: skip

    outcome = run_training(job, partial(FileReporter, str(tmp_path / "log.jsonl")))

    assert outcome.status == "succeeded", outcome.error
    run_state = list(store.list(keys.train_runs(job.job_id)))
    assert run_state and all(k.startswith(f"{keys.train_runs(job.job_id)}{job.run_name}/") for k in run_state)
    # Every object in the bucket is a key the store can delete: no pyarrow directory markers ("…/").
    assert [k for k in store.list("") if k.endswith("/")] == []
    assert any(k.endswith(f"/{POINTER}") for k in run_state)  # the pointer checkpoint, uploaded by the worker
    # Nothing of the run on a local disk: not in Ray Train's default ~/ray_results, not in the
    # cluster's data dir (where the old default, <data dir>/train_runs, was), not in the test's dir.
    for root in (Path.home() / "ray_results", RAY_SETTINGS.data_dir, tmp_path):
        assert _local_copies(root, job.run_name) == []
