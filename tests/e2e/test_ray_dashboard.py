"""What an operator sees of one job on the Ray dashboard: its Train run, datasets and tasks are
found by the job's id (state API `/api/v0/tasks`, `/api/v0/actors`, the Train tab's
`/api/train/v2/runs/v1`, the Data tab's `/api/data/datasets/<ray job>`), its figures are on the
head's Prometheus endpoint (`ray_openft_*`), and the job leaves no pile of dead actors behind.

One tiny stand-in job (20 rows, 1 epoch) and one merge of its adapter, in an account of its own;
the metrics are compared before and after, since other tests share the service."""

from __future__ import annotations

import io
import os
from pathlib import Path

import httpx
import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from tests.e2e.conftest import metric_total, openft_metrics
from tests.utils.polling import until

pytestmark = pytest.mark.e2e

MODEL = "qwen2.5-0.5b-instruct"
SFT = {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
    "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 8, "lora_alpha": 16}}}


def _dashboard(people_service) -> httpx.Client:
    # Ray's token auth is on for this cluster (tests/conftest.py made the token): the dashboard's
    # HTTP API takes it as a bearer token, as `ray.util.state` sends it.
    token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    return httpx.Client(base_url=people_service.ray.dashboard_url, headers={"Authorization": f"Bearer {token}"},
                        timeout=60)  # fmt: skip


def _state(dash: httpx.Client, resource: str) -> list[dict]:
    reply = dash.get(f"/api/v0/{resource}", params={"limit": 10000, "detail": "true"})
    reply.raise_for_status()
    return reply.json()["data"]["result"]["result"]


def _train_runs(dash: httpx.Client, *, started: bool = True) -> list[dict]:
    """The Train tab's runs. Ray Train creates its state actor with the cluster's first run: until
    then (`started=False`) the endpoint answers 500, as it always did with state tracking off."""
    reply = dash.get("/api/train/v2/runs/v1")
    if reply.status_code == 500 and not started:
        return []
    assert reply.status_code == 200, reply.text
    return reply.json()["train_runs"]


def _dead_actors(dash) -> int:
    return sum(1 for a in _state(dash, "actors") if a["state"] == "DEAD")


def test_a_jobs_id_finds_its_run_datasets_tasks_and_figures(people_service):
    dash = _dashboard(people_service)
    client = people_service.client(people_service.new_key())
    before, dead_before, tasks_before = openft_metrics(people_service), _dead_actors(dash), len(_state(dash, "tasks"))
    rows, _ = ticket_splits()
    upload = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(rows[:20]))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=MODEL, training_file=upload.id, method=SFT, seed=0)

    # While it runs: the Train tab lists a run named after the job and its attempt.
    seen: dict = {}

    def running_run():
        job_now = client.fine_tuning.jobs.retrieve(job.id)
        assert job_now.status not in ("failed", "cancelled"), job_now.error
        found = [r for r in _train_runs(dash, started=False) if r["name"].startswith(f"{job.id}-attempt-1-")]
        if found:
            seen["run"] = found[0]
        return bool(found) or job_now.status == "succeeded"

    until(running_run, "the job's Train run on the dashboard", 400, interval=1)
    until(lambda: client.fine_tuning.jobs.retrieve(job.id).status == "succeeded", "the job to succeed", 400,
          interval=1)  # fmt: skip
    assert "run" in seen, "the Train run was never listed under the job's id"
    run = next(r for r in _train_runs(dash) if r["name"] == seen["run"]["name"])
    assert run["status"] == "FINISHED" and run["attempts"]

    # Tasks carry the job's id: the attempt, and the parity check when it is on.
    tasks = [t for t in _state(dash, "tasks") if t["name"].startswith(job.id)]
    names = {t["name"] for t in tasks}
    assert f"{job.id} run a1" in names, names
    ray_job = next(t["job_id"] for t in tasks if t["name"] == f"{job.id} run a1")
    assert run["job_id"] == ray_job  # the Train run and the datasets below are under the same Ray job

    # Datasets: the upload's validation, the tokenizing and the training read, by file and job id.
    reply = dash.get(f"/api/data/datasets/{ray_job}")
    reply.raise_for_status()
    datasets = [d["dataset"] for d in reply.json()["datasets"]]
    for name in (f"{upload.id} validate", f"{job.id} tokenize", f"{job.id} train"):
        assert any(d.startswith(name) for d in datasets), (name, datasets)

    # The merge of its adapter: one task per shard named after the ft: model.
    model = client.fine_tuning.jobs.retrieve(job.id).fine_tuned_model
    path = f"/gridline/adapters/{model}/merged"
    client.post(path, cast_to=object)
    merge = until(lambda: (m := client.get(path, cast_to=object))["status"] in ("succeeded", "failed") and m,
                  "the merge's end", 300, interval=1)  # fmt: skip
    assert merge["status"] == "succeeded", merge["error"]
    # Workers report task events to the GCS every second or so: a quick merge's reach the state API after it ended.
    until(lambda: [t for t in _state(dash, "tasks") if t["name"].startswith(f"merge {model} ")],
          "a merge task named after the model", 60, interval=1)  # fmt: skip

    # No dead FooterReader actors (Ray Data read_parquet's footer pool), and few dead actors at all.
    actors = _state(dash, "actors")
    footer_readers = [a for a in actors if a["class_name"] == "FooterReader"]
    dead_added = _dead_actors(dash) - dead_before
    print(f"\nthe job and its merge: {len(_state(dash, 'tasks')) - tasks_before} tasks, {dead_added} dead actors "
          f"({len(footer_readers)} FooterReader)")  # fmt: skip
    assert not footer_readers, f"{len(footer_readers)} FooterReader actors, {dead_added} dead actors added"
    assert dead_added <= 12
    # Ray Train's preemption watcher is off (train/launcher.py RAY_TRAIN_ENV): no run started one.
    assert not [a for a in actors if a["class_name"] == "PreemptionWatcher"]

    # The figures, once the processes' metrics reached the head's agent (Ray reports every few seconds).
    def figures():
        after = openft_metrics(people_service)
        seen["after"] = after

        def grew(name, **labels):
            return metric_total(after, f"{name}_count", **labels) - metric_total(before, f"{name}_count", **labels)

        return (metric_total(after, "ray_openft_jobs", status="succeeded") >= 1
                and grew("ray_openft_job_queue_wait_seconds", model=MODEL) >= 1
                and grew("ray_openft_train_time_to_first_step_seconds", model=MODEL) >= 1
                and grew("ray_openft_train_tokens_per_second", model=MODEL) >= 1
                and grew("ray_openft_upload_validation_mb_per_second") >= 1
                and grew("ray_openft_merge_gb_per_second", model=MODEL) >= 1)  # fmt: skip

    until(figures, "the openft metrics on the head's Prometheus endpoint", 90, interval=2)
    after = seen["after"]

    # Ray 2.60 exports a histogram's `_sum` from its buckets' midpoints (its OpenTelemetry recorder),
    # so a figure is checked by the bucket it fell in, against the same figure read from the API.
    def bucket(name, **labels) -> tuple[float, float]:
        grew = {}
        for (n, ls), _ in after.items():
            le = dict(ls).get("le")
            if n == f"{name}_bucket" and le is not None:
                grew[float(le)] = (metric_total(after, n, **labels, le=le) - metric_total(before, n, **labels, le=le))
        bounds = sorted(grew)
        upper = next(b for b in bounds if grew[b] >= 1)
        return max([b for b in bounds if b < upper], default=0.0), upper

    def within(value, name, **labels) -> bool:
        low, high = bucket(name, **labels)
        return low <= value <= high

    done = client.fine_tuning.jobs.retrieve(job.id)
    log = sorted(client.fine_tuning.jobs.list_events(job.id, limit=100), key=lambda e: e.created_at)
    started = next(e.created_at for e in log if e.message == "Fine-tuning job started.")
    first_step = next(e.created_at for e in log if e.type == "metrics" and e.created_at >= started)
    result = done.model_extra["gridline"]["result"]
    assert within(first_step - started, "ray_openft_train_time_to_first_step_seconds", model=MODEL)
    assert within(done.trained_tokens / result["seconds"], "ray_openft_train_tokens_per_second", model=MODEL)
    assert bucket("ray_openft_job_queue_wait_seconds", model=MODEL)[0] <= started - done.created_at
    assert bucket("ray_openft_upload_validation_mb_per_second")[1] > 0
    assert bucket("ray_openft_merge_gb_per_second", model=MODEL)[1] > 0
    statuses = {dict(ls)["status"] for (n, ls) in after if n == "ray_openft_jobs"}
    assert {"queued", "running", "succeeded", "failed"} <= statuses
