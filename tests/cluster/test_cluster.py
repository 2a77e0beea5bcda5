"""The whole service on a real three-node Ray cluster (tests/cluster/conftest.py), through the
`openai` SDK against one `openft serve` on the head: an upload validated by Ray Data, a job
(tokenization on Ray Data, training on Ray Train, the parity check), a merge, a batch on the ft:
model and a distillation of its results. Each stage's Ray tasks and actors are looked up in the
head's state API and printed with the node they ran on: the API replicas and the job controller
on the head, every task or actor that took a CPU or a `trainer` on a worker node.

The same flow runs on a one-node Ray too (`openft serve` starting its own, the laptop setup),
beside the cluster's, and every deterministic result must be byte-identical: the tokenized
shards, the adapter (CPU, same seed), the merged weights, the batch's completions and the
distilled files.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from storage.objects import open_object_store
from tests.cluster.conftest import SESSION_DIR, WORKERS, cluster_service_env, s3_settings, service_env, serving
from tests.factories import batch_request_line, jsonl
from tests.serve_app.test_training_api import events, wait
from tests.utils.polling import until
from worker.controller import CONTROLLER_NAME

# The flow twice (one node, then the cluster) in a module fixture: longer than pytest-timeout's 600 s default.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

MODEL = "qwen2.5-0.5b-instruct"
ROWS = ticket_splits()[0][:60]
TICKETS = [ticket for ticket, _ in ticket_splits()[1][:12]]
METHOD = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
    "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3}}}
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


@dataclass
class Outcome:
    job: object
    merge: dict
    batch: object
    distilled: dict
    digests: dict[str, str]
    seconds: float


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_flow(service) -> Outcome:
    """Upload, train, merge, batch on the ft: model, distill its results: digests of every
    deterministic result, by name."""
    started = time.monotonic()
    key = service.new_key()
    client = openai.OpenAI(base_url=service.base_url, api_key=key, max_retries=2)
    digests: dict[str, str] = {}

    upload = client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(ROWS))), purpose="fine-tune")
    assert upload.status == "processed", upload
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=upload.id, method=METHOD, seed=0)
    try:
        job = wait(client, job.id, timeout=900)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its events: {[e.message for e in events(client, job.id)]}") from None
    assert job.status == "succeeded", (job.error, [e.message for e in events(client, job.id)])
    model = job.fine_tuned_model
    for name in ADAPTER_FILES:
        got = httpx.get(f"{service.base_url}/gridline/adapters/{model}/files/{name}",
                        headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert got.status_code == 200, got.status_code
        digests[f"adapter/{name}"] = sha(got.content)

    store = open_object_store(service.env["OPENFT_STORAGE_URL"], s3_endpoint_url=service.env["OPENFT_S3_ENDPOINT_URL"])
    shards = sorted(store.list("tokenized/"))
    assert any(k.endswith(".parquet") for k in shards), shards
    digests.update({k: sha(store.get_bytes(k)) for k in shards})

    path = f"/gridline/adapters/{model}/merged"
    client.post(path, cast_to=object)
    merge = until(lambda: _merge_ended(client, path), "the merge's end", 900, interval=1)
    assert merge["status"] == "succeeded", merge["error"]
    # gridline_merge.json names the job and model (ids of this run); the weights must match.
    digests.update({f"merged/{f['path']}": f["sha256"] for f in merge["files"] if f["path"] != "gridline_merge.json"})

    requests = jsonl(batch_request_line(f"t{i}", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                        model=model, temperature=0, max_tokens=6) for i, t in enumerate(TICKETS))
    batch_input = client.files.create(file=("requests.jsonl", io.BytesIO(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=batch_input.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = until(lambda: _batch_ended(client, batch.id), "the batch's end", 900, interval=1)
    assert batch.status == "completed" and batch.request_counts.completed == len(TICKETS), batch
    answers = sorted((line["custom_id"], line["response"]["body"]["choices"][0]["message"]["content"])
                     for line in map(orjson.loads, client.files.content(batch.output_file_id).content.splitlines()))
    digests["batch/answers"] = sha(json.dumps(answers).encode())

    distilled = client.post("/files/distill", body={"results_file": batch.output_file_id, "seed": 3}, cast_to=object)
    for part in ("training_file", "validation_file"):
        if distilled.get(part):
            digests[f"distilled/{part}"] = sha(client.files.content(distilled[part]["id"]).content)
    assert "distilled/training_file" in digests, distilled
    return Outcome(job, merge, batch, distilled, digests, time.monotonic() - started)


def _merge_ended(client, path: str) -> dict | None:
    merge = client.get(path, cast_to=object)
    return merge if merge["status"] in ("succeeded", "failed", "expired") else None


def _batch_ended(client, batch_id: str):
    batch = client.batches.retrieve(batch_id)
    return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None


# -- the one-node reference and the cluster run ---------------------------------------------------
@pytest.fixture(scope="session")
def reference(seaweed, cluster_bucket):
    """The flow on a one-node Ray that `openft serve` starts itself (SQLite, 2 CPUs), in a thread of
    its own beside the cluster's start and the cluster's flow (`on_cluster`): the two share nothing
    but the S3 server, each under a prefix of its own, and the suite waits on Ray's starts and on
    job polls much of the time (test-cluster kept the machine 60 % busy with one flow after the
    other). A future: `.result()` is the flow's `Outcome`, or raises what the flow raised."""
    data_dir = SESSION_DIR / "reference"
    env = service_env(data_dir, OPENFT_TRAIN_WORKER_RESOURCES='{"CPU": 1}', **s3_settings(seaweed, cluster_bucket, "reference"))
    data_dir.mkdir()

    def flow() -> Outcome:
        with serving(env, SESSION_DIR / "reference-serve.log") as service:
            outcome = run_flow(service)
        print(f"\none-node reference flow: {outcome.seconds:.0f} s")
        return outcome

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference") as pool:
        yield pool.submit(flow)  # leaving waits for the flow and its service's stop


@pytest.fixture(scope="module")
def on_cluster(reference, cluster, cluster_db, seaweed, cluster_bucket):  # the reference first: it starts the thread
    env = cluster_service_env(cluster, "cluster", cluster_db, seaweed, cluster_bucket,
                              OPENFT_TRAIN_WORKER_RESOURCES='{"CPU": 1, "trainer": 1}')
    with serving(env, SESSION_DIR / "cluster-serve.log") as service:
        outcome = run_flow(service)
        print(f"\ncluster flow: {outcome.seconds:.0f} s")
        yield outcome, placements(cluster), reference.result(timeout=900)


@dataclass
class Placed:
    kind: str  # "task" or "actor"
    name: str
    node: str
    resources: dict


def placements(cluster) -> list[Placed]:
    """Every task and actor of the cluster's history with the node it ran on, printed."""
    from ray.util.state import list_actors, list_tasks

    names = cluster.node_names()
    found = []
    for t in list_tasks(address=cluster.dashboard_url, limit=10000, detail=True, raise_on_missing_output=False):
        if t.node_id and t.type != "DRIVER_TASK":
            found.append(Placed("task", t.name or t.func_or_class_name, names.get(t.node_id, "?"), t.required_resources or {}))
    for a in list_actors(address=cluster.dashboard_url, limit=10000, detail=True, raise_on_missing_output=False):
        if a.node_id:
            found.append(Placed("actor", a.name or a.class_name, names.get(a.node_id, "?"), a.required_resources or {}))
    return found


def takes_work(placed: Placed) -> bool:
    """A CPU or a `trainer`, directly or through a placement group's bundle (`CPU_group_...`)."""
    return any(v > 0 and (k.split("_group_")[0] in ("CPU", "trainer")) for k, v in placed.resources.items())


def where(found: list[Placed], match) -> set[str]:
    return {p.node for p in found if match(p)}


def show(stage: str, found: list[Placed], match) -> set[str]:
    """Print the stage's tasks and actors, one line per name and node with its count; their nodes."""
    picked = Counter((p.kind, p.name, p.node) for p in found if match(p))
    for (kind, name, node), n in sorted(picked.items()):
        print(f"  {stage:<10} {kind:<5} {name[:64]:<64} x{n:<3} on {node}")
    assert picked, f"no Ray task or actor of the {stage} stage in the state API"
    return {node for _, _, node in picked}


# -- the tests ------------------------------------------------------------------------------------
def test_every_stage_runs_on_the_worker_nodes_and_the_service_on_the_head(on_cluster):
    outcome, found, _ = on_cluster
    job_id = outcome.job.id
    print()
    assert show("api", found, lambda p: p.kind == "actor" and "openft-api" in p.name) == {"head"}
    assert show("controller", found, lambda p: p.kind == "actor" and p.name == CONTROLLER_NAME) == {"head"}
    workers = set(WORKERS)
    assert show("run", found, lambda p: p.name.startswith(f"{job_id} run a")) <= workers | {"head"}
    assert show("train", found, lambda p: "RayTrainWorker" in p.name) <= workers
    assert show("parity", found, lambda p: p.name == f"{job_id} parity") <= workers
    assert show("merge", found, lambda p: p.name.startswith(f"merge {outcome.job.fine_tuned_model} ")) <= workers
    assert show("ray data", found, lambda p: p.kind == "task" and ("Map" in p.name or "Read" in p.name)) <= workers
    heavy = [p for p in found if takes_work(p)]
    assert heavy and where(heavy, lambda p: True) <= workers, [p for p in heavy if p.node not in workers]
    # Both worker nodes took work: the nodes really are separate, and Ray spread the stages over them.
    assert where(heavy, lambda p: True) == workers


def test_results_on_the_cluster_are_byte_identical_to_one_node(on_cluster):
    outcome, _, reference = on_cluster
    print(f"\n{len(reference.digests)} results compared; the first few:")
    for name in sorted(reference.digests)[:8]:
        print(f"  {name}: {reference.digests[name][:16]}")
    assert outcome.digests.keys() == reference.digests.keys()
    differ = {k for k in reference.digests if outcome.digests[k] != reference.digests[k]}
    assert not differ, f"differ from the one-node run: {sorted(differ)}"
    assert outcome.job.trained_tokens == reference.job.trained_tokens
