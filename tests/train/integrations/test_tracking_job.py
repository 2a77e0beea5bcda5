"""A real stand-in job through the SDK with both integrations: wandb (offline mode, read back
from its run file) and MLflow (a real `mlflow server` from .venv-mlflow, read back with
MlflowClient) each hold the job's losses, equal to its metrics events, its hyperparameters and
its result. One tiny job (12 rows, 1 epoch) on a deployment of its own with its own controller."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from openft.demo_data import ticket_splits, tickets_jsonl
from tests.conftest import free_port
from tests.serve_app.test_training_api import events, wait
from tests.utils.polling import until
from tests.utils.wandb_log import finished_offline_run

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[3]
MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"
SFT = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 4, "lora_rank": 8}}}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    if not MLFLOW.exists():
        pytest.fail(f"{MLFLOW} is missing: `make test-heavy` creates .venv-mlflow (mlflow==3.17.2)")
    root, port = tmp_path_factory.mktemp("mlflow"), free_port()
    proc = subprocess.Popen(
        [str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts")],
        stdout=open(root / "server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    until(healthy, "mlflow server", timeout=240, interval=0.5)
    server = Server(url, proc)
    yield server
    server.stop()


@dataclass
class Server:
    url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        """The whole process group: `mlflow server` runs uvicorn in a child process of its own."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tracking_api(apis, mlflow_server):
    import ray

    from worker.controller import start_controller

    api = apis("tracking", wandb_mode="offline", mlflow_tracking_uri=mlflow_server.url, tracking_poll_seconds=0.5,
               parity_check=False)
    handle = start_controller(api.settings, name=f"controller-{uuid.uuid4().hex[:6]}")
    yield api
    ray.get(handle.stop.remote())
    ray.kill(handle)


def tiny_job(api, **integrations):
    """A 12-row, 1-epoch stand-in job (3 steps): (client, created job, ended job)."""
    _, key = api.create_account()
    client = api.client(key)
    train_rows, _ = ticket_splits()
    upload = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(train_rows[:12]))), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=upload.id, method=SFT, seed=0,
                                         **integrations)
    return client, job, wait(client, job.id)


@pytest.fixture(scope="module")
def tracked_job(tracking_api):
    return tiny_job(tracking_api, integrations=[
        {"type": "wandb", "wandb": {"project": "p"}},
        {"type": "mlflow", "mlflow": {"experiment": "openft-test", "tags": {"team": "nlp"}}}])


def forwarder_gone(job_id: str) -> bool:
    import ray

    from train.integrations.forwarder import actor_name

    try:
        ray.get_actor(actor_name(job_id))
    except ValueError:
        return True
    return False


def test_the_job_object_returns_the_integrations_in_openai_shape(tracked_job):
    client, created, ended = tracked_job
    assert ended.status == "succeeded", ended.error
    for job in (created, client.fine_tuning.jobs.retrieve(created.id)):
        wandb = job.integrations[0]
        assert (wandb.type, wandb.wandb.project, wandb.wandb.name, wandb.wandb.entity) == ("wandb", "p", None, None)
        assert job.integrations[1].type == "mlflow"  # our extension, parsed leniently by the SDK
        assert job.integrations[1].to_dict()["mlflow"] == {"experiment": "openft-test", "run_name": None,
                                                           "tags": {"team": "nlp"}}


def step_losses(client, job_id) -> list[tuple[int, float]]:
    rows = [e.data for e in events(client, job_id) if e.type == "metrics" and e.data and "step" in e.data]
    assert rows, "the job wrote no metrics events"
    return [(d["step"], d["train_loss"]) for d in rows]


def test_the_wandb_offline_run_holds_the_jobs_losses(tracked_job, tracking_api):
    client, job, ended = tracked_job
    run = finished_offline_run(tracking_api.settings.resolved_wandb_dir(), job.id)
    assert [(h["_step"], h["train_loss"]) for h in run.history] == step_losses(client, job.id)
    assert (run.project, run.name, run.run_id) == ("p", job.id, job.id)
    assert "openft/qwen2.5-0.5b-instruct" in run.tags and f"openft/{job.id}" in run.tags
    assert run.config["batch_size"] == 4 and run.config["lora_rank"] == 8 and run.config["seed"] == 0
    assert run.summary["status"] == "succeeded" and run.summary["trained_tokens"] == ended.trained_tokens > 0
    assert run.summary["fine_tuned_model"] == ended.fine_tuned_model and run.exit_code == 0
    assert run.summary["result/eval_loss"] == ended.model_extra["gridline"]["result"]["eval_loss"]


def test_the_mlflow_run_holds_the_jobs_losses(tracked_job, tracking_api, mlflow_server):
    from mlflow.tracking import MlflowClient

    client, job, ended = tracked_job
    mlflow = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = mlflow.get_experiment_by_name("openft-test")

    def finished_run():
        runs = mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`openft.job_id` = '{job.id}'")
        return runs[0] if len(runs) == 1 and runs[0].info.status == "FINISHED" else None

    run = until(finished_run, "finished mlflow run", timeout=60, interval=0.5)
    history = sorted((m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "train_loss"))
    assert history == step_losses(client, job.id)
    assert run.info.run_name == job.id and run.data.tags["team"] == "nlp"
    assert run.data.tags["openft.status"] == "succeeded" and run.data.tags["openft.fine_tuned_model"] == ended.fine_tuned_model
    assert run.data.params["batch_size"] == "4" and run.data.params["model"] == "qwen2.5-0.5b-instruct"
    assert run.data.metrics["trained_tokens"] == ended.trained_tokens
    warns = [e for e in events(client, job.id) if e.level == "warn"]
    assert warns == [], [(e.message, e.data) for e in warns]
    until(lambda: forwarder_gone(job.id), "the forwarder's exit", timeout=180, interval=0.5)


def test_a_tracking_server_that_is_down_warns_and_the_job_still_succeeds(tracked_job, tracking_api, mlflow_server):
    mlflow_server.stop()  # the tests above have read what they need from it
    with pytest.raises(httpx.HTTPError):
        httpx.get(mlflow_server.url + "/health", timeout=5)
    client, job, ended = tiny_job(tracking_api, integrations=[
        {"type": "mlflow", "mlflow": {"experiment": "openft-test"}}, {"type": "wandb", "wandb": {"project": "p"}}])
    assert ended.status == "succeeded", ended.error
    until(lambda: forwarder_gone(job.id), "the forwarder's exit", timeout=180, interval=0.5)
    warns = [e.data for e in events(client, job.id) if e.level == "warn"]
    assert warns == [{"code": "integration_failed", "integration": "mlflow", "stage": "start", "error": "ConnectError"}]
    run = finished_offline_run(tracking_api.settings.resolved_wandb_dir(), job.id)  # wandb logs on
    assert [(h["_step"], h["train_loss"]) for h in run.history] == step_losses(client, job.id)
