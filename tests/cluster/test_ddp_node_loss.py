"""Data-parallel training on the cluster: a 2-worker job (train_num_workers=2, placed SPREAD) whose
Ray Train workers run on the two worker nodes; one node is SIGKILLed (its whole process group:
`ray start`, its raylet, its workers) after the first checkpoint, and the job resumes from that
checkpoint with both workers on the node that remains, and succeeds with the whole schedule.

Runs after tests/cluster/test_cluster.py (file order): the cluster has one worker node fewer
afterwards. Each worker takes half a CPU and one `trainer`, so that both fit, with the CPU kept
free for their reads (train_data_cpus), on one node of 2 CPUs and 2 `trainer`s.
"""

from __future__ import annotations

import io

import openai
import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from openft.holdout import holdout_size
from tests.cluster.conftest import cluster_service_env, serving
from tests.serve_app.test_training_api import events, wait
from tests.serve_app.test_training_control import event_matching
from tests.utils.polling import until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

MODEL = "qwen2.5-0.5b-instruct"
ROWS = ticket_splits()[0]
EPOCHS, BATCH = 4, 2  # a checkpoint at each epoch's end: the node dies with epochs left to train
STEPS = -(-(len(ROWS) - holdout_size(len(ROWS))) // BATCH) * EPOCHS


def train_workers(cluster) -> dict[str, str]:
    """The live Ray Train workers: actor id -> worker node name."""
    from ray.util.state import list_actors

    names = cluster.node_names()
    alive = list_actors(address=cluster.dashboard_url, filters=[("class_name", "=", "RayTrainWorker"),
                                                                ("state", "=", "ALIVE")], limit=100)  # fmt: skip
    return {a.actor_id: names.get(a.node_id, "?") for a in alive}


def test_a_2_worker_job_spans_both_nodes_and_survives_losing_one(cluster, fresh_pg_url, seaweed, cluster_bucket):
    env = cluster_service_env(cluster, "ddp", fresh_pg_url, seaweed, cluster_bucket, OPENFT_TRAIN_NUM_WORKERS="2",
                              OPENFT_TRAIN_WORKER_RESOURCES='{"CPU": 0.5, "trainer": 1}', OPENFT_RUN_LEASE_SECONDS="5",
                              OPENFT_PARITY_CHECK="false")  # fmt: skip  (parity has its own check in test_cluster.py)
    with serving(env, cluster.nodes["head"].log.with_name("ddp-serve.log")) as service:
        client = openai.OpenAI(base_url=service.base_url, api_key=service.new_key(), max_retries=2)
        upload = client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(ROWS))), purpose="fine-tune")
        method = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
            "n_epochs": EPOCHS, "batch_size": BATCH, "learning_rate": 1e-3}}}
        job = client.fine_tuning.jobs.create(model=MODEL, training_file=upload.id, method=method, seed=0)

        before = until(lambda: (w := train_workers(cluster)) and len(w) == 2 and w, "two live Train workers", 600, 1)
        print(f"\nTrain workers before the loss: {sorted(before.values())}")
        assert sorted(before.values()) == ["node_a", "node_b"]  # SPREAD: one on each worker node
        event_matching(client, job.id, r"Checkpoint saved at step \d+\.", timeout=900)
        cluster.kill_node("node_b")

        after = until(lambda: (w := train_workers(cluster)) and len(w) == 2 and not w.keys() & before.keys() and w,
                      "two new Train workers", 600, 1)  # fmt: skip
        print(f"Train workers after the loss: {sorted(after.values())}")
        assert set(after.values()) == {"node_a"}
        done = wait(client, job.id, timeout=900)
        said = [e.message for e in events(client, job.id)]
        print("events:", *said, sep="\n  ")
        assert done.status == "succeeded", (done.error, said)
        assert any(m.startswith("Resumed from the checkpoint at step ") for m in said), said
        assert done.model_extra["gridline"]["result"]["steps"] == STEPS  # the whole schedule, across the loss
        assert said.count("The job has successfully completed.") == 1
