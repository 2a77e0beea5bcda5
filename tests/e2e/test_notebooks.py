"""examples/ executed in a real Jupyter kernel (nbclient) against the suite's running service, its Ray
cluster (the notebooks join it with ray.init) and a SeaweedFS bucket holding an OpenAI batch's input
and output: notebook 1 distills and fine-tunes, 2 and 3 reuse its job, so the suite trains once.
A cell that raises fails the test; the executed notebooks are kept under build/e2e/."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import nbformat
import pytest

from openft.demo_data import SYSTEM, ticket_splits
from tests.factories import batch_error_line, batch_request_line, batch_result_line, jsonl, message

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernelspec for this interpreter, installed into a directory of its own."""
    prefix = tmp_path_factory.mktemp("jupyter")
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "openft-e2e"],
                   check=True, capture_output=True)  # fmt: skip
    return prefix / "share" / "jupyter" / "kernels"


def run_notebook(name: str, env: dict[str, str], kernel_dir: Path, artifacts: Path) -> nbformat.NotebookNode:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLES / name, as_version=4)
    km = KernelManager(kernel_name="openft-e2e", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(nb, km=km, timeout=900, resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute(env=env)
    finally:
        nbformat.write(nb, artifacts / name)
    return nb


def text_of(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.fixture(scope="module")
def batch_bucket(seaweed):
    """An OpenAI batch's input and output for the ticket task in a bucket, two of its requests failed."""
    bucket = f"nb-{uuid.uuid4().hex[:16]}"
    s3 = boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    rows = ticket_splits()[0][:80]
    requests = [batch_request_line(f"t-{i}", [message("system", SYSTEM), message("user", t)]) for i, (t, _) in enumerate(rows)]
    results = [batch_error_line(f"t-{i}") if i in (3, 17) else batch_result_line(f"t-{i}", label)
               for i, (_, label) in enumerate(rows)]  # fmt: skip
    s3.put_object(Bucket=bucket, Key="batch/input.jsonl", Body=jsonl(requests))
    s3.put_object(Bucket=bucket, Key="batch/output.jsonl", Body=jsonl(results))
    return bucket, s3


def test_the_example_notebooks_run_against_the_service(people_service, seaweed, batch_bucket, kernel, artifacts, tmp_path):
    bucket, s3 = batch_bucket
    env = {**os.environ, "OPENFT_BASE_URL": people_service.base_url, "OPENFT_API_KEY": people_service.new_key(),
           "RAY_ADDRESS": people_service.ray.gcs_address, "S3_ENDPOINT_URL": seaweed.endpoint_url,
           "DATAKIT_BUCKET": bucket, "OPENFT_MODEL_SOURCE": "standin", "DATAKIT_MODEL_CACHE": str(tmp_path / "models"),
           "PYTHONPATH": str(ROOT),
           # the cluster suite's tiny job (seed 0, the notebook's default): its stand-in fine-tune passes
           # the serving-parity check, which a fine-tune that never learnt to end its turn fails
           "DATAKIT_HYPERPARAMETERS": '{"n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3}', "MPLBACKEND": "module://matplotlib_inline.backend_inline"}  # fmt: skip

    first = run_notebook("01_distill_and_fine_tune.ipynb", env, kernel, artifacts)
    out = text_of(first)
    job_id = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("JOB_ID="))
    assert "dropped: {'errored': 2}" in out
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="distilled/")["Contents"]}
    assert keys == {"distilled/train.jsonl", "distilled/eval.jsonl"}

    env["OPENFT_JOB_ID"] = job_id
    second = text_of(run_notebook("02_compare_with_batches.ipynb", env, kernel, artifacts))
    assert "comparing qwen2.5-0.5b-instruct with ft:qwen2.5-0.5b-instruct" in second
    assert "{'base': '" in second and "'ft': '" in second

    third = run_notebook("03_loss_curve.ipynb", env, kernel, artifacts)
    assert "steps, training loss" in text_of(third)
    images = [o for c in third.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1
