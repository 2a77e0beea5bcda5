"""A deployment whose object store is S3 (a real SeaweedFS), as in production: uploads, adapter
downloads and merged exports go through the API as they do on the local store, and a merged file
answers with a redirect to a presigned S3 URL that works without our key."""

from __future__ import annotations

import hashlib
import uuid

import boto3
import httpx
import pytest

from catalog.bases import get_base
from catalog.standins import standin_dir
from merge.run import ADAPTER_CONFIG, ADAPTER_MODEL
from serve_app.state import AppState
from storage.models import File
from tests.factories import chat_row, jsonl
from tests.merge.builders import train_adapter
from tests.serve_app.test_merges_api import Env

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def s3_env(apis, seaweed):
    bucket = f"api-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    api = apis("s3", storage_url=f"s3://{bucket}/openft", s3_endpoint_url=seaweed.endpoint_url)
    state = AppState.from_settings(api.settings)
    yield api, Env(api.base_url, state), bucket
    state.db.dispose()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.heavy  # a deployment of its own on S3 with a merge (about 40 s): make test-heavy
def test_files_adapters_and_merged_exports_on_s3(s3_env, seaweed, tmp_path):
    api, env, bucket = s3_env
    account_id, key = api.create_account()
    client, auth = api.client(key), {"authorization": f"Bearer {key}"}
    objects = boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1")

    data = jsonl([chat_row(f"Ticket {i}: charged twice?", "billing") for i in range(20)])
    uploaded = client.files.create(file=("train.jsonl", data), purpose="fine-tune")
    assert client.files.content(uploaded.id).content == data
    with env.state.db.session() as s:
        object_key = s.get(File, uploaded.id).object_key
    assert objects.get_object(Bucket=bucket, Key=f"openft/{object_key}")["Body"].read() == data

    base = get_base("qwen2.5-0.5b-instruct")
    adapter = train_adapter(standin_dir(base, tmp_path / "cache"), base, tmp_path / "adapter")
    model = env.register(account_id, adapter)
    for name, stored in ((ADAPTER_MODEL, adapter.model), (ADAPTER_CONFIG, adapter.config)):
        got = httpx.get(f"{api.base_url}/gridline/adapters/{model}/files/{name}", headers=auth)
        assert got.status_code == 200 and got.content == stored
        assert got.headers["x-gridline-sha256"] == _sha(stored)

    path = f"/gridline/adapters/{model}/merged"
    assert client.post(path, cast_to=object)["status"] == "queued"
    assert env.work()
    done = client.get(path, cast_to=object)
    assert done["status"] == "succeeded" and done["files"]
    prefix = env.row(account_id, model).export_prefix
    for entry in done["files"]:
        redirect = httpx.get(f"{api.base_url}{path}/files/{entry['path']}", headers=auth)
        assert redirect.status_code == 302 and redirect.headers["x-gridline-sha256"] == entry["sha256"]
        location = redirect.headers["location"]
        assert location.startswith(f"{seaweed.endpoint_url}/{bucket}/openft/{prefix}/{entry['path']}?")
        blob = httpx.get(location)  # the presigned URL is the credential
        assert blob.status_code == 200, entry["path"]
        assert (len(blob.content), _sha(blob.content)) == (entry["bytes"], entry["sha256"]), entry["path"]

    assert env.call(key, "DELETE", model).json()["deleted"] is True
    assert objects.list_objects_v2(Bucket=bucket, Prefix=f"openft/{prefix}/").get("KeyCount") == 0
    assert httpx.get(location).status_code == 404
