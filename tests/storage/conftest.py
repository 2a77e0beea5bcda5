"""Fixtures for object-store tests: a fresh bucket (or directory) per test on the session's SeaweedFS."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from storage.objects import MIN_PART_SIZE, ObjectStore, open_object_store
from tests.utils.seaweed import SeaweedServer


@pytest.fixture(scope="session")
def s3_admin(seaweed: SeaweedServer) -> Any:
    """A raw boto3 client for what the store does not do: creating buckets."""
    return boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1")


@pytest.fixture
def s3_bucket(s3_admin: Any) -> str:
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    s3_admin.create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The same store behaviour on both backends; writers use the smallest part size S3 allows."""
    if request.param == "local":
        return open_object_store(f"file://{tmp_path / 'objects'}")
    seaweed: SeaweedServer = request.getfixturevalue("seaweed")
    bucket = request.getfixturevalue("s3_bucket")
    return open_object_store(f"s3://{bucket}/root", seaweed.endpoint_url, part_size=MIN_PART_SIZE)
