"""The Ray Data stages over the S3 backend (a real SeaweedFS), against the same stages over a
local store: production keeps objects in S3, and Ray's workers read them there directly."""

from __future__ import annotations

import hashlib
import uuid

import boto3
import pytest

from catalog.model_source import ModelSource
from openft.demo_data import ticket_splits, tickets_jsonl
from pipelines.distill import DistillOptions, distill_local
from pipelines.distill_ray import build_distill
from pipelines.tokenize import build_tokenized, read_tokenized, tokenized_dataset
from pipelines.validate import StreamingValidator
from pipelines.validate_ray import build_validation
from storage.objects import open_object_store
from tests.factories import distill_files

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def s3_store(seaweed):
    bucket = f"p-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return open_object_store(f"s3://{bucket}/openft", seaweed.endpoint_url)


def _rows(dataset) -> list[dict]:
    rows = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()} for r in dataset.iter_rows()]
    return sorted(rows, key=lambda r: r["line"])


@pytest.mark.heavy  # make test-heavy: beyond make test's budget
def test_validation_tokenization_and_distillation_run_on_s3(s3_store, tmp_path):
    data = tickets_jsonl(ticket_splits()[0])
    s3_store.put_bytes("files/a/train", data)

    inline = StreamingValidator("fine-tune")
    inline.feed(data)
    assert build_validation(s3_store.spec(), "files/a/train", "fine-tune", block_bytes=4096) == inline.finish()

    local = open_object_store(f"file://{tmp_path / 'objects'}")
    local.put_bytes("files/a/train", data)
    sha = hashlib.sha256(data).hexdigest()
    args = ("files/a/train", sha, "qwen2.5-0.5b-instruct", ModelSource("standin"), tmp_path / "models", 256, "supervised")
    on_s3 = build_tokenized(s3_store.spec(), *args, block_bytes=4096)
    on_disk = build_tokenized(local.spec(), *args, block_bytes=4096)
    assert on_s3.report == on_disk.report and on_s3.rows == len(ticket_splits()[0])
    expected = read_tokenized(local, on_disk.prefix)
    assert read_tokenized(s3_store, on_s3.prefix) == expected
    assert _rows(tokenized_dataset(s3_store.spec(), on_s3.prefix)) == expected

    results, requests, _ = distill_files("anthropic", 400, seed=2)
    s3_store.put_bytes("files/a/results", results)
    s3_store.put_bytes("files/a/requests", requests)
    options = DistillOptions(seed=3)
    out = build_distill(s3_store.spec(), "files/a/results", "files/a/requests", "files/a/distill", options,
                        block_bytes=8192)
    train, valid, dropped = distill_local([results], [requests], options)
    assert (s3_store.get_bytes(out.train_key), s3_store.get_bytes(out.eval_key), out.dropped) == (train, valid, dropped)
    assert not [k for k in s3_store.list("files/a/distill/") if "/shards/" in k]
