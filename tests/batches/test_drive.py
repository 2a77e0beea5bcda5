"""A batch driven to its end by batches/run.py `drive` with the real engine (pipelines/batch_ray.py
`run_batch` on the session's Ray cluster, the qwen2.5 stand-in and two random LoRA adapters
registered as ft: models): completed with its files, counts, usage and timestamps; a model
deleted mid-batch still answers from the staged copy; cancel mid-run and expiry mid-run keep
what finished (those two in make test-heavy). SQLite: the transitions' PostgreSQL runs are tests/batches/test_lifecycle.py's."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from openai.types.chat import ChatCompletion
from sqlalchemy import update

from batches import run as batch_run
from batches import transitions
from catalog.bases import get_base
from openft.settings import Settings
from serve_app.services.models import delete_model
from storage import keys
from storage.db import Database
from storage.models import Batch, File
from tests.batches.test_lifecycle import World
from tests.factories import JOB_MODEL, batch_request_line, db_ft_model, db_stored_file, jsonl, message, random_adapter
from tests.utils.polling import until

TICKETS = ["My parcel never arrived.", "I was charged twice.", "I cannot log in.", "Cancel my plan."]


@pytest.fixture(scope="module")
def world(tmp_path_factory, ray_cluster):
    settings = Settings(data_dir=tmp_path_factory.mktemp("drive"), model_source="standin", batch_max_rows_in_flight=4,
                        run_lease_seconds=3)
    db = Database(settings.resolved_database_url())
    yield World(settings, db)
    db.dispose()


@pytest.fixture(scope="module")
def models(world):
    """(account, [ft A, ft B]): two servable ft: models whose adapters change the base's answers."""
    account = world.account()
    base = get_base(JOB_MODEL)
    names = [db_ft_model(world.db, world.store, account.id, random_adapter(base, world.settings.model_cache_dir, seed))
             for seed in (1, 2)]
    return account, names


def submit(world, account, lines: list[dict]) -> str:
    from serve_app.services import batches as service

    file_id = db_stored_file(world.settings, account.id, jsonl(lines), purpose="batch", stats={"rows": len(lines)})
    return service.create_batch(world.state, account, {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                       "completion_window": "24h"}).id


def start(world, batch_id: str) -> threading.Thread:
    [claim] = [c for c in world.claim(now=int(time.time())) if c.batch_id == batch_id]
    thread = threading.Thread(target=batch_run.drive, args=(world.ctx, claim), daemon=True)
    thread.start()
    return thread


def file_lines(world, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    with world.db.session() as session:
        row = session.get(File, file_id)
        assert row.purpose == "batch_output" and row.bytes > 0
        key = row.object_key
    return [orjson.loads(line) for line in world.store.get_bytes(key).splitlines()]


def greedy(custom_id: str, model: str, ticket: str, **body) -> dict:
    return batch_request_line(custom_id, [message("user", ticket)], model=model,
                              **{"temperature": 0, "max_tokens": 6, **body})


def test_a_batch_runs_to_completed_and_a_model_deleted_mid_batch_keeps_its_copy(world, models):
    account, (ft_a, ft_b) = models
    lines = [greedy(f"{tag}-{j}", m, t) for tag, m in (("base", JOB_MODEL), ("a", ft_a), ("b", ft_b))
             for j, t in enumerate(TICKETS)]
    lines.append(greedy("unknown", "no-such-model", TICKETS[0]))
    batch_id = submit(world, account, lines)
    thread = start(world, batch_id)
    until(lambda: world.get(batch_id).in_progress_at, "in_progress", timeout=60)
    delete_model(world.state, account, ft_b)  # staged already: the batch keeps its copy
    thread.join(timeout=300)
    row = world.get(batch_id)
    assert row.status == "completed", row.errors
    assert row.in_progress_at <= row.finalizing_at <= row.completed_at and row.lease_owner is None
    assert row.request_counts == {"total": 13, "completed": 12, "failed": 1}
    assert row.usage["input_tokens"] > 0 and row.usage["output_tokens"] > 0
    out, errors = file_lines(world, row.output_file_id), file_lines(world, row.error_file_id)
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines[:12]]
    assert [(e["custom_id"], e["response"]["body"]["error"]["code"]) for e in errors] == [("unknown", "model_not_found")]
    answers = {}
    for o in out:
        completion = ChatCompletion.model_validate(o["response"]["body"])
        answers.setdefault(completion.model, []).append(completion.choices[0].message.content)
    assert set(answers) == {JOB_MODEL, ft_a, ft_b} and len({a[0] for a in answers.values()}) == 3
    assert list(world.store.list(keys.batch_stage(batch_id))) == [] and row.stage_deleted_at is not None


# Lines enough that the batch cannot finish between its first finished line and the cancel, however
# fast the machine generates (60 once took about 17 s here; in another run all 60 finished before the
# cancel landed): a cancel stops the rest, so the count costs little when generation is slow.
MANY = 240


@pytest.mark.heavy  # about 17 s of generation here
def test_cancel_mid_run_stops_within_seconds_and_keeps_what_finished(world, models):
    account, (ft_a, _) = models
    lines = [greedy(f"c-{i}", [JOB_MODEL, ft_a][i % 2], TICKETS[i % 4] + " more" * (i % 60), max_tokens=48)
             for i in range(MANY)]
    batch_id = submit(world, account, lines)
    thread = start(world, batch_id)
    until(lambda: world.get(batch_id).request_counts["completed"] > 0, "a finished line", timeout=300, interval=0.2)
    asked = time.monotonic()
    with world.db.session() as session:
        assert transitions.cancel(session, transitions.lock_batch(session, batch_id), int(time.time())).ok
    thread.join(timeout=120)
    assert time.monotonic() - asked < 20
    row = world.get(batch_id)
    assert row.status == "cancelled" and row.cancelled_at >= row.cancelling_at
    out, errors = file_lines(world, row.output_file_id), file_lines(world, row.error_file_id)
    assert 0 < len(out) == row.request_counts["completed"] < MANY and len(errors) == row.request_counts["failed"]
    assert sorted(x["custom_id"] for x in out + errors) == sorted(f"c-{i}" for i in range(MANY))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


@pytest.mark.heavy  # about 25 s of generation here
def test_expiry_mid_run_keeps_what_finished(world, models):
    """The completion window ends while the batch runs (its expires_at moved to now, as the clock
    would after 24 h: tests/serve_app/test_batches_e2e.py runs a real short window)."""
    account, (ft_a, _) = models
    lines = [greedy(f"x-{i}", ft_a, TICKETS[i % 4] + " again" * (i % 60), max_tokens=48) for i in range(MANY)]
    batch_id = submit(world, account, lines)
    thread = start(world, batch_id)
    until(lambda: world.get(batch_id).request_counts["completed"] > 0, "a finished line", timeout=300, interval=0.2)
    with world.db.session() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=int(time.time())))
    thread.join(timeout=120)
    row = world.get(batch_id)
    assert row.status == "expired" and row.expired_at >= row.expires_at and row.cancelled_at is None
    out, errors = file_lines(world, row.output_file_id), file_lines(world, row.error_file_id)
    assert 0 < len(out) < MANY and sorted(x["custom_id"] for x in out + errors) == sorted(f"x-{i}" for i in range(MANY))
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
