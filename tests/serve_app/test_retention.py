"""The reaper (`reap_once`) on a real SQLite file and a real local object store (and a real S3 one
for Ray Train's run state), with the clock passed in: it deletes exactly what has passed its
retention, nothing in use, and a second pass at the same time deletes nothing more."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest

from openft.ids import file_id as new_file_id
from openft.ids import new_id
from openft.settings import Settings
from serve_app.services.retention import reap_once
from serve_app.state import AppState
from storage import keys as object_keys
from storage.accounts import create_account
from storage.arrow import arrow_location
from storage.jobs import add_event
from storage.models import File, FineTunedModel, Job, JobEvent, Merge, TokenizedReap
from storage.tokenized_reaps import STALE_S, mark, shards_in_use, unmark, wait_while_marked
from tests.serve_app.test_billing import MODEL, put_job

NOW = 1_900_000_000
DAY = 86400


@pytest.fixture
def state(tmp_path: Path) -> AppState:
    state = AppState.from_settings(Settings(data_dir=tmp_path / "d"))
    state.now = lambda: NOW
    yield state
    state.db.dispose()


def add_file(state: AppState, account_id: str, sha: str, *, created_at: int) -> str:
    row = File(id=new_file_id(), account_id=account_id, filename="t.jsonl", purpose="fine-tune", bytes=3,
               created_at=created_at, created_ns=time.time_ns(), expires_at=created_at + 30 * DAY, status="processed",
               sha256=sha, object_key=f"files/{account_id}/{sha}", stats={})
    state.store.put_bytes(row.object_key, b"{}\n")
    with state.db.session() as session:
        session.add(row)
    return row.id


def add_run(state: AppState, job_id: str, sha: str) -> None:
    """What a run leaves: tokenized shards of its file, checkpoints and its adapter."""
    for key in (f"tokenized/{sha}/base@rev/supervised-512/shard-0.parquet", f"tokenized/{sha}/base@rev/supervised-512/manifest.json",
                f"runs/{job_id}/checkpoints/step-4/state.pt", f"runs/{job_id}/adapter/adapter_model.safetensors",
                f"runs/{job_id}/adapter/adapter_config.json"):
        state.store.put_bytes(key, b"x")


def ended(state: AppState, account_id: str, file_id: str, *, days_ago: float, status: str = "succeeded") -> str:
    finished = int(NOW - days_ago * DAY)
    job_id = put_job(state.db, account_id, status=status, created_at=finished - 3600, finished_at=finished,
                     training_file=file_id)
    with state.db.session() as session:
        add_event(session, job_id, finished, "Fine-tuning job started.")
        add_event(session, job_id, finished, "The job has successfully completed.")
    return job_id


def keys(state: AppState, prefix: str) -> list[str]:
    return list(state.store.list(prefix))


def test_reaper_deletes_exactly_what_expired_and_nothing_in_use(state: AppState, caplog):
    with state.db.session() as session:
        alice, _ = create_account(session, "alice", open_jobs_limit=3)
        bob, _ = create_account(session, "bob", open_jobs_limit=3)
    a, b = alice.id, bob.id

    # Files: one 31 days old, one 31 days old that an open job reads, one 28 days old.
    old_file = add_file(state, a, "f-old", created_at=NOW - 31 * DAY)
    busy_file = add_file(state, a, "f-busy", created_at=NOW - 31 * DAY)
    young_file = add_file(state, a, "f-young", created_at=NOW - 28 * DAY)
    put_job(state.db, a, training_file=busy_file)

    # Runs: shards of sha "s-alone" only an 8-day-old job used; "s-shared" is the same bytes in
    # bob's account, where a job is still open; "s-recent" a job ended 3 days ago used too.
    alone = ended(state, a, add_file(state, a, "s-alone", created_at=NOW - 9 * DAY), days_ago=8)
    with_model = ended(state, a, add_file(state, a, "s-shared", created_at=NOW - 9 * DAY), days_ago=8)
    put_job(state.db, b, training_file=add_file(state, b, "s-shared", created_at=NOW - DAY))
    failed = ended(state, a, add_file(state, a, "s-recent", created_at=NOW - 9 * DAY), days_ago=8, status="failed")
    recent = ended(state, b, add_file(state, b, "s-recent", created_at=NOW - 4 * DAY), days_ago=3)
    for job_id, sha in ((alone, "s-alone"), (with_model, "s-shared"), (failed, "s-recent"), (recent, "s-recent")):
        add_run(state, job_id, sha)
    with state.db.session() as session:
        session.add(FineTunedModel(id=f"ft:{MODEL}:x:1", account_id=a, job_id=with_model, base=MODEL, servable=True,
                                   adapter_prefix=f"runs/{with_model}/adapter", files={}, created_at=0, created_ns=0))

    # Jobs: ended 181 days ago and 179 days ago (their copies go first, in the same pass).
    ancient = ended(state, a, old_file, days_ago=181)
    kept_record = ended(state, a, old_file, days_ago=179)

    # An export past its 7 days.
    with state.db.session() as session:
        session.add(Merge(id=new_id("merge-"), account_id=a, model=f"ft:{MODEL}:x:1", base=MODEL, status="succeeded",
                          export_prefix=f"exports/{a}/m1/", adapter_sha256={}, files=[], created_at=NOW - 8 * DAY,
                          created_ns=0, finished_at=NOW - 8 * DAY, expires_at=NOW - DAY))
    state.store.put_bytes(f"exports/{a}/m1/model.safetensors", b"w")

    caplog.set_level(logging.INFO, logger="openft.reaper")
    counts = reap_once(state)
    assert counts == {"files": 1, "run_copies": 5, "run_objects": 7, "tokenized_files": 1, "jobs": 1, "events": 2,
                      "exports": 1, "webhook_deliveries": 0, "eval_runs": 0}
    assert [r.getMessage() for r in caplog.records] == [f"reaped {counts}"]

    with state.db.session() as session:
        assert session.get(File, old_file).deleted_at == NOW
        assert session.get(File, busy_file).deleted_at is None and session.get(File, young_file).deleted_at is None
    assert keys(state, f"files/{a}/f-old") == [] and keys(state, f"files/{a}/f-busy") != []
    assert keys(state, "tokenized/") == [
        f"tokenized/{sha}/base@rev/supervised-512/{name}"
        for sha in ("s-recent", "s-shared") for name in ("manifest.json", "shard-0.parquet")]
    assert keys(state, f"runs/{alone}/") == [] and keys(state, f"runs/{failed}/") == []
    assert keys(state, f"runs/{with_model}/") == [f"runs/{with_model}/adapter/{n}" for n in
                                                   ("adapter_config.json", "adapter_model.safetensors")]
    assert len(keys(state, f"runs/{recent}/")) == 3
    assert keys(state, "exports/") == []

    assert reap_once(state) == dict.fromkeys(counts, 0)  # idempotent

    # A day later the other job reaches 180 days and goes with its events; once bob's open job
    # ends and 7 days pass, the shards it shared go too.
    assert reap_once(state, NOW + DAY) == {**dict.fromkeys(counts, 0), "jobs": 1, "events": 2}
    with state.db.session() as session:
        assert session.get(Job, ancient) is None and session.get(Job, kept_record) is None
        assert session.query(JobEvent).filter(JobEvent.job_id.in_([ancient, kept_record])).count() == 0
        assert session.get(Job, alone) is not None
        open_job = session.query(Job).filter(Job.account_id == b, Job.finished_at.is_(None)).one()
        open_job.status, open_job.finished_at = "cancelled", NOW + DAY
    later = reap_once(state, NOW + 9 * DAY)
    assert (later["tokenized_files"], later["run_copies"]) == (2, 2)
    assert keys(state, "tokenized/") == []


def test_ray_train_run_state_is_reaped_from_the_store(seaweed, tmp_path):
    """A cluster's runs leave their Ray Train state in the bucket, on no node's disk: the reaper on
    the API node deletes it through the store with the job's other copies."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    bucket = f"r-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    state = AppState.from_settings(Settings(data_dir=tmp_path / "d", storage_url=f"s3://{bucket}/openft",
                                            s3_endpoint_url=seaweed.endpoint_url))  # fmt: skip
    try:
        with state.db.session() as session:
            alice, _ = create_account(session, "alice", open_jobs_limit=1)
        job = ended(state, alice.id, add_file(state, alice.id, "s-1", created_at=NOW - 9 * DAY), days_ago=8)
        add_run(state, job, "s-1")
        # Written as Ray Train writes it: its own storage context, through the store's pyarrow filesystem.
        fs, path = arrow_location(state.store.spec(), object_keys.train_runs(job))
        run = StorageContext(storage_path=path, experiment_dir_name=f"{job}-a1-x", storage_filesystem=fs)
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "openft_checkpoint.json").write_text("{}")
        run.persist_current_checkpoint(Checkpoint.from_directory(str(tmp_path / "ckpt")), "checkpoint_0")
        assert len(keys(state, object_keys.train_runs(job))) == 2  # the storage check's marker file and the checkpoint

        assert reap_once(state, NOW)["run_objects"] == 5
        assert keys(state, "runs/") == []
        assert not (tmp_path / "d" / "train_runs").exists()
    finally:
        state.db.dispose()


def test_reaper_marks_the_bytes_it_deletes_and_a_starting_job_waits_the_mark_out(state: AppState):
    with state.db.session() as session:
        carol, _ = create_account(session, "carol", open_jobs_limit=3)
    job_id = ended(state, carol.id, add_file(state, carol.id, "s-race", created_at=NOW - 9 * DAY), days_ago=8)
    add_run(state, job_id, "s-race")

    # Another reaper's fresh mark: this pass leaves the bytes to it.
    with state.db.session() as session:
        assert mark(session, "s-race", NOW - 60)
        assert not mark(session, "s-race", NOW)
    assert reap_once(state)["tokenized_files"] == 0 and keys(state, "tokenized/s-race/") != []

    # A controller starting a job on marked bytes waits until the mark is removed, or goes stale.
    clock = [NOW]
    with state.db.session() as session:
        mark(session, "s-other", NOW)
    _waits_until(state, "s-other", clock, lambda: _unmark(state, "s-other"))
    _waits_until(state, "s-race", clock, lambda: clock.__setitem__(0, NOW - 60 + STALE_S))

    # The other reaper died mid-delete: a later pass takes its stale mark over and finishes.
    with state.db.session() as session:
        assert not shards_in_use(session, "s-race", NOW - 7 * DAY)
    assert reap_once(state, NOW + STALE_S)["tokenized_files"] == 1
    assert keys(state, "tokenized/") == []
    with state.db.session() as session:
        assert session.query(TokenizedReap).count() == 0  # no mark outlives its pass


def _unmark(state: AppState, sha: str) -> None:
    with state.db.session() as session:
        unmark(session, sha)


def _waits_until(state: AppState, sha: str, clock: list[int], release) -> None:
    released = threading.Event()

    def start_job():
        wait_while_marked(state.db, sha, clock=lambda: clock[0], poll_s=0.02)
        released.set()

    waiter = threading.Thread(target=start_job)
    waiter.start()
    assert not released.wait(0.3), sha
    release()
    assert released.wait(5), sha
    waiter.join()
