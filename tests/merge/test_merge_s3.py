"""The merge with its adapter and export in S3 (a real SeaweedFS): the same files, byte for byte,
as a merge on the local store, and every export file served by a presigned GET."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import boto3
import httpx
import pytest

from merge.run import ADAPTER_CONFIG, ADAPTER_MODEL, run_merge
from storage.objects import open_object_store
from tests.merge.builders import store_request

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_merge_on_s3_matches_the_local_merge(tmp_path, qwen7b, qwen7b_adapter, model_cache, seaweed):
    base, _ = qwen7b
    local = store_request(tmp_path, base, qwen7b_adapter, model_source="standin", cache_root=model_cache)
    bucket = f"m-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    s3 = open_object_store(f"s3://{bucket}/openft", seaweed.endpoint_url)
    s3.put_bytes(f"adapters/a1/{ADAPTER_CONFIG}", qwen7b_adapter.config)
    s3.put_bytes(f"adapters/a1/{ADAPTER_MODEL}", qwen7b_adapter.model)

    on_disk = run_merge(local)
    on_s3 = run_merge(dataclasses.replace(local, store_spec=s3.spec()))

    assert on_s3.files == on_disk.files and any(f["modified"] for f in on_s3.files)
    for f in on_s3.files:
        body = httpx.get(s3.presigned_get_url(f"exports/m1/{f['path']}", 300)).content
        assert (len(body), hashlib.sha256(body).hexdigest()) == (f["bytes"], f["sha256"]), f["path"]
