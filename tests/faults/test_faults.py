"""Faults injected into real runs (stand-in base, CPU Ray Train worker), each ending in a defined
state with nothing lost: a succeeded job has one model, one charge and coherent events; a failed
one has its code and no model.

- SIGKILL of the whole `openft serve` process group mid-training, then a restart on the same data
  dir (SQLite and PostgreSQL): the run's lease lapses, the restarted controller requeues it once and
  it resumes from its checkpoint.
- `ray.kill` of the controller actor mid-run: Ray restarts it, and it takes the job over.
- SIGKILL of the Ray Train worker mid-step: Ray Train restarts it from its checkpoint; killed
  twice, the job fails `platform_interrupted`. A reinforcement job's killed worker resumes to the
  same adapter bytes as the same job run without a fault.
- SIGSTOP of the Train worker (a hung step): the stall watchdog stops the run, `training_failed`.
- PostgreSQL restarted mid-job: the run and the controller ride through.
- The S3 server stopped mid-run and started again: the job resumes or fails with a code; it never
  succeeds without its adapter.
- A time limit shorter than Ray Train's start: the run is stopped, `time_limit_exceeded`.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import openai
import pytest
from sqlalchemy import select

from entrypoints.ray_runtime import ray_temp_dir
from openft.demo_data import ticket_splits
from openft.holdout import holdout_size
from openft.settings import Settings
from storage.db import Database
from storage.models import FineTunedModel, Job, LedgerEntry
from storage.objects import open_object_store
from tests.conftest import Api, free_port
from tests.faults.conftest import assert_cluster_at_rest, kill, processes_matching, train_worker_pid
from tests.serve_app.test_training_api import events, wait
from tests.serve_app.test_training_control import MODEL, event_matching, first_metrics, in_db, model_rows, new_client, \
    start_job
from tests.train.test_rft import prompts_jsonl
from tests.utils.polling import until

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("ray_cluster")]

# 206 training rows after the holdout, batch 1, 5 epochs: 1,030 steps with a checkpoint every 206,
# long enough (10 s and more here) that a fault injected after the first checkpoint lands mid-run,
# not after the last step. Every step more is paid again by each test that trains to the end.
ROWS = ticket_splits()[0]
EPOCHS = 5
STEPS = (len(ROWS) - holdout_size(len(ROWS))) * EPOCHS
CHECKPOINT = r"Checkpoint saved at step \d+\."


def messages(client, job_id: str) -> list[str]:
    return [e.message for e in events(client, job_id)]


def assert_succeeded_once(api, client, job, *, attempts: int):
    done = wait(client, job.id, timeout=600)
    assert done.status == "succeeded", done.error
    said = messages(client, job.id)
    assert said.count("The job has successfully completed.") == 1
    assert said.count("Fine-tuning job started.") == attempts
    assert done.model_extra["gridline"]["result"]["steps"] == STEPS  # the whole schedule, across runs
    assert model_rows(api, job.id) == [done.fine_tuned_model]
    assert in_db(api, lambda s: s.get(Job, job.id).attempts) == attempts
    assert in_db(api, lambda s: s.get(Job, job.id).lease_owner) is None
    return done, said


# -- the whole service killed and restarted -------------------------------------------------------
def _env(data_dir: Path, database_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OPENFT_"))}
    env.update(OPENFT_MODEL_SOURCE="standin", OPENFT_BILLING_ENABLED="true", OPENFT_RUN_LEASE_SECONDS="5",
               OPENFT_CONTROLLER_POLL_SECONDS="0.5", OPENFT_DATA_DIR=str(data_dir),
               OPENFT_PARITY_CHECK="false")  # as tests/faults/conftest.py `service`: recovery, not parity
    if database_url:
        env["OPENFT_DATABASE_URL"] = database_url
    return env


def _openft(env, *args) -> str:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=True).stdout


def _serve(env, port: int) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, deadline = [], time.monotonic() + 240
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        assert line, "openft serve exited:\n" + "".join(lines[-40:])
        lines.append(line)
        if line.startswith("openft API:"):
            # Keep reading its output so that the pipe never fills and blocks the server.
            import threading

            threading.Thread(target=server.stdout.read, daemon=True).start()
            return server, line.split(": ", 1)[1].strip()
    raise AssertionError("openft serve did not start:\n" + "".join(lines[-40:]))


def _kill_service(server: subprocess.Popen, data_dir: Path) -> None:
    """SIGKILL the server's process group and every process of its Ray cluster, as a crash of the
    machine's service would: nothing gets to clean up."""
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:  # killed already
        pass
    server.wait(timeout=30)
    marker = str(ray_temp_dir(Settings(data_dir=data_dir)))
    until(lambda: [kill(pid) for pid in processes_matching(marker)] == [], "the old cluster's processes to die", 60)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once(database, request):
    database_url = request.getfixturevalue("fresh_pg_url") if database == "postgres" else None
    data_dir = Path(tempfile.mkdtemp(prefix="oftkill-"))
    env = _env(data_dir, database_url)
    key = _openft(env, "accounts", "create", "alice").strip().splitlines()[-1]
    _openft(env, "accounts", "credit", "alice", "50.00")
    port = free_port()
    server, base_url = _serve(env, port)
    try:
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        job = start_job(client, ROWS, n_epochs=EPOCHS)
        event_matching(client, job.id, CHECKPOINT, timeout=300)  # it trains, with a checkpoint to resume from
        _kill_service(server, data_dir)

        server, base_url = _serve(env, port)
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=2)
        api = Api("serve", Settings(data_dir=data_dir, database_url=database_url), base_url)
        done, said = assert_succeeded_once(api, client, job, attempts=2)
        assert sum(m.startswith("The run was lost") for m in said) == 1
        assert any(m.startswith("Resumed from the checkpoint at step ") for m in said)
        db = Database(api.settings.resolved_database_url(), migrate=False)
        with db.session() as session:
            kinds = session.scalars(select(LedgerEntry.kind).where(LedgerEntry.job_id == job.id)).all()
            assert sorted(kinds) == ["charge", "hold", "release"]
            assert session.scalar(select(Job.charge).where(Job.id == job.id))["cents"] > 0
        db.dispose()
    finally:
        _kill_service(server, data_dir)


# -- the controller actor killed ------------------------------------------------------------------
def test_ray_kill_of_the_controller_actor_mid_run_resumes_scheduling_and_the_job_finishes(service):
    import ray

    api, handle = service("ctlkill")
    client = new_client(api)
    job = start_job(client, ROWS, n_epochs=EPOCHS)
    event_matching(client, job.id, CHECKPOINT, timeout=300)
    before = ray.get(handle.controller_id.remote())
    ray.kill(handle, no_restart=False)  # the actor dies with its run's task; Ray restarts it
    until(lambda: _restarted_id(handle, before), "the controller's restart", 120)
    _, said = assert_succeeded_once(api, client, job, attempts=2)
    assert sum(m.startswith("The run was lost") for m in said) == 1


def _restarted_id(handle, before: str) -> str | None:
    import ray

    try:
        now = ray.get(handle.controller_id.remote(), timeout=10)
    except Exception:
        return None
    return now if now != before else None


# -- the Train worker killed, or hung ------------------------------------------------------------
def test_sigkill_of_the_train_worker_mid_step_resumes_from_its_checkpoint(service):
    api, _ = service("workerkill")
    client = new_client(api)
    job = start_job(client, ROWS, n_epochs=EPOCHS)
    event_matching(client, job.id, CHECKPOINT, timeout=300)
    kill(train_worker_pid())
    _, said = assert_succeeded_once(api, client, job, attempts=1)  # Ray Train's own retry, same attempt
    assert "Worker lost, retrying from checkpoint." in said
    assert any(m.startswith("Resumed from the checkpoint at step ") for m in said)


def start_rft_job(client):
    """A reinforcement job long enough (two epochs of 19 steps, 8 samples a prompt) that a kill after
    its first checkpoint (step 4, eval_interval) lands mid-run."""
    prompts = client.files.create(file=("p.jsonl", io.BytesIO(prompts_jsonl(ROWS[:40]))), purpose="fine-tune")
    grader = {"type": "string_check", "name": "answer", "input": "{{sample.output_text}}", "reference": "{{item.answer}}",
              "operation": "eq"}
    return client.fine_tuning.jobs.create(model=MODEL, training_file=prompts.id, seed=0, method={
        "type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
            "batch_size": 2, "n_epochs": 2, "compute_multiplier": 1.0, "eval_interval": 4, "eval_samples": 1,
            "max_completion_tokens": 16, "temperature": 1.0}}})  # fmt: skip


def test_sigkill_of_the_train_worker_mid_rft_resumes_to_the_uninterrupted_runs_adapter(service):
    """Issue 26: a reinforcement run whose Train worker is killed resumes from its checkpoint (its
    adapter, optimizer, progress and RNG state; sampling seeded per job, epoch, line and sample) and
    ends with the same adapter bytes and rewards as the same job run without a fault."""
    api, _ = service("rftkill")
    client = new_client(api)
    whole = wait(client, start_rft_job(client).id, timeout=600)
    assert whole.status == "succeeded", whole.error
    job = start_rft_job(client)
    event_matching(client, job.id, r"Checkpoint saved at step 4\.", timeout=300)
    kill(train_worker_pid())
    done = wait(client, job.id, timeout=600)
    assert done.status == "succeeded", done.error
    said = messages(client, job.id)
    assert "Worker lost, retrying from checkpoint." in said
    resumed = [int(m.rsplit(" ", 1)[1].rstrip(".")) for m in said if m.startswith("Resumed from the checkpoint at step ")]
    assert resumed and 4 <= resumed[0] < done.model_extra["gridline"]["result"]["steps"]  # mid-run, not after the end
    first, second = (done_job.model_extra["gridline"]["result"] for done_job in (whole, done))
    assert {k: second[k] for k in ("steps", "eval_reward_before", "eval_reward")} == \
        {k: first[k] for k in ("steps", "eval_reward_before", "eval_reward")}
    files = {j.id: in_db(api, lambda s, j=j: s.scalars(select(FineTunedModel.files).where(FineTunedModel.job_id == j.id)).one())
             for j in (whole, done)}
    assert files[done.id]["adapter_model.safetensors"]["sha256"] == files[whole.id]["adapter_model.safetensors"]["sha256"]


def test_a_train_worker_lost_twice_fails_platform_interrupted(service):
    api, _ = service("workerkill2")
    client = new_client(api)
    job = start_job(client, ROWS, n_epochs=EPOCHS)
    first_metrics(client, job.id)
    first = train_worker_pid()
    kill(first)
    event_matching(client, job.id, r"Worker lost, retrying from (checkpoint|the start)\.", timeout=240)
    until(lambda: train_worker_pid() != first, "the restarted worker", 120)
    kill(train_worker_pid())
    done = wait(client, job.id, timeout=300)
    assert (done.status, done.error.code, done.fine_tuned_model) == ("failed", "platform_interrupted", None)
    assert events(client, job.id)[-1].data == {"code": "platform_interrupted"}
    assert model_rows(api, job.id) == []


def test_a_hung_train_worker_is_stopped_by_the_stall_watchdog(service):
    api, _ = service("stall", run_stall_seconds=60)  # above Ray Train's start, which writes nothing
    client = new_client(api)
    job = start_job(client, ROWS, n_epochs=EPOCHS)
    first_metrics(client, job.id)
    pid = train_worker_pid()
    kill(pid, signal.SIGSTOP)
    try:
        done = wait(client, job.id, timeout=180)
    finally:
        kill(pid, signal.SIGCONT)
    assert (done.status, done.error.code) == ("failed", "training_failed")
    assert "no progress for 60 s" in done.error.message
    until(lambda: pid not in processes_matching("ray::RayTrainWorker"), "the hung worker's end", 60)


def test_a_time_limit_shorter_than_the_runs_start_stops_it(service):
    """The limit counts from the run's start: model load, tokenization and Ray Train's start (10 s
    and more here: two processes start and import torch) are past it before a step runs. The create's
    quote checks the limit too, so the operator lowers it after create: the controller bounds the
    accepted job by the limit it runs with."""
    api, _ = service("limit", controller={"job_time_limit_seconds": 6})
    client = new_client(api)
    job = start_job(client, ROWS[:20], n_epochs=1, batch_size=4)
    done = wait(client, job.id, timeout=240)
    assert (done.status, done.error.code, done.fine_tuned_model) == ("failed", "time_limit_exceeded", None)
    assert model_rows(api, job.id) == []
    # The stopped run's Train workers' placement group is freed by the controller's sweep while it
    # runs (the fixture's own check comes after the controller has stopped, when nothing sweeps).
    assert_cluster_at_rest()


# -- the database and the object store go away ----------------------------------------------------
def test_postgres_restarted_mid_job_is_ridden_through(service, private_pg):
    api, _ = service("pgrestart", database_url=private_pg.url)
    client = new_client(api)
    job = start_job(client, ROWS, n_epochs=EPOCHS)
    first_metrics(client, job.id)
    private_pg.restart()
    assert_succeeded_once(api, client, job, attempts=1)


def test_s3_stopped_mid_run_and_started_again_never_succeeds_without_its_adapter(service, seaweed, tmp_path):
    from tests.utils.seaweed import start_seaweed

    store_server = start_seaweed(tmp_path / "weed", secret_key=seaweed.secret_key)
    try:
        boto3.client("s3", endpoint_url=store_server.endpoint_url, region_name="us-east-1").create_bucket(Bucket="faults")
        api, _ = service("s3outage", storage_url="s3://faults/openft", s3_endpoint_url=store_server.endpoint_url)
        client = new_client(api)
        job = start_job(client, ROWS, n_epochs=EPOCHS)
        first_metrics(client, job.id)
        store_server.stop()  # before the first epoch's checkpoint: it is written during the outage
        time.sleep(12)
        store_server.restart()
        done = wait(client, job.id, timeout=600)
        if done.status == "succeeded":
            store = open_object_store(api.settings.resolved_storage_url(), s3_endpoint_url=store_server.endpoint_url)
            files = in_db(api, lambda s: s.scalar(select(FineTunedModel.files).where(FineTunedModel.job_id == job.id)))
            prefix = in_db(api, lambda s: s.scalar(select(FineTunedModel.adapter_prefix).where(
                FineTunedModel.job_id == job.id)))
            for name, meta in files.items():
                assert hashlib.sha256(store.get_bytes(f"{prefix}/{name}")).hexdigest() == meta["sha256"]
        else:
            assert done.status == "failed" and done.error.code, done
            assert model_rows(api, job.id) == []
    finally:
        store_server.stop()
