"""The one resolver of model names (jobs/model_names.py) on a real SQLite database: bases, `ft:`
models, checkpoints, and every name that must answer None (unknown, another account's, deleted,
reaped, rotated out)."""

from __future__ import annotations

import time

import pytest

from catalog.bases import BASES
from jobs.model_names import CHECKPOINTS_KEPT, ResolvedModel, kept_checkpoints, resolve_model
from openft.settings import Settings
from storage.db import Database
from storage.models import FineTunedModel, Job
from tests.factories import JOB_MODEL, db_account, db_job_with_checkpoints


@pytest.fixture
def db(tmp_path):
    database = Database(Settings(data_dir=tmp_path / "d").resolved_database_url())
    yield database
    database.dispose()


def resolve(db, account_id: str, name: str) -> ResolvedModel | None:
    with db.session() as session:
        return resolve_model(session, account_id, name)


def test_a_base_resolves_for_anyone_with_the_catalogs_servability(db):
    account = db_account(db)
    assert resolve(db, account, JOB_MODEL) == ResolvedModel(JOB_MODEL, JOB_MODEL, "base", None, True, None)
    gpt = resolve(db, account, "gpt-oss-20b")
    assert (gpt.kind, gpt.servable, gpt.reason) == ("base", False, BASES["gpt-oss-20b"].not_servable_reason)


@pytest.mark.parametrize("name", ["gpt-4o", "", "ft:", "ft:qwen2.5-0.5b-instruct:abc:0123456789ab",
                                  "qwen2.5-0.5b-instruct:ckpt-step-1", "ft:x:y:z:ckpt-step-0"])
def test_unknown_names_resolve_to_none(db, name):
    assert resolve(db, db_account(db), name) is None


def test_an_ft_model_resolves_for_its_account_only_until_deleted(db):
    owner, other = db_account(db), db_account(db)
    job_id, name = db_job_with_checkpoints(db, owner, [])
    assert resolve(db, owner, name) == ResolvedModel(name, JOB_MODEL, "ft", f"runs/{job_id}/adapter/", True, None)
    assert resolve(db, other, name) is None
    with db.session() as session:
        session.get(FineTunedModel, name).deleted_at = int(time.time())
    assert resolve(db, owner, name) is None


def test_a_download_only_ft_model_resolves_not_servable_with_its_reason(db):
    owner = db_account(db)
    _, name = db_job_with_checkpoints(db, owner, [4], model="gpt-oss-20b")
    reason = BASES["gpt-oss-20b"].not_servable_reason
    found = resolve(db, owner, name)
    assert (found.kind, found.base_id, found.servable, found.reason) == ("ft", "gpt-oss-20b", False, reason)
    ckpt = resolve(db, owner, f"{name}:ckpt-step-4")
    assert (ckpt.kind, ckpt.servable, ckpt.reason) == ("checkpoint", False, reason)


def test_the_newest_checkpoints_resolve_older_ones_and_unknown_steps_do_not(db):
    owner, other = db_account(db), db_account(db)
    steps = [10, 20, 30, 40, 50]
    job_id, name = db_job_with_checkpoints(db, owner, steps)
    kept = steps[-CHECKPOINTS_KEPT:]
    for step in kept:
        assert resolve(db, owner, f"{name}:ckpt-step-{step}") == ResolvedModel(
            f"{name}:ckpt-step-{step}", JOB_MODEL, "checkpoint", f"runs/{job_id}/checkpoints/step-{step:08d}/", True, None)
        assert resolve(db, other, f"{name}:ckpt-step-{step}") is None
    for step in [10, 20, 35, 60]:
        assert resolve(db, owner, f"{name}:ckpt-step-{step}") is None
    assert resolve(db, owner, f"{name}:ckpt-step-050") is None  # one spelling per step
    with db.session() as session:
        assert [c.step for c in kept_checkpoints(session, session.get(Job, job_id))] == kept[::-1]


def test_a_running_jobs_checkpoint_resolves_before_its_model_is_registered(db):
    owner = db_account(db)
    _, name = db_job_with_checkpoints(db, owner, [7], register=False)
    assert resolve(db, owner, name) is None  # no ft: model yet
    assert resolve(db, owner, f"{name}:ckpt-step-7").kind == "checkpoint"


def test_checkpoints_of_a_deleted_model_or_a_reaped_run_resolve_to_none(db):
    owner = db_account(db)
    deleted_job, deleted = db_job_with_checkpoints(db, owner, [5])
    reaped_job, reaped = db_job_with_checkpoints(db, owner, [5])
    assert resolve(db, owner, f"{deleted}:ckpt-step-5") and resolve(db, owner, f"{reaped}:ckpt-step-5")
    with db.session() as session:
        session.get(FineTunedModel, deleted).deleted_at = int(time.time())
        session.get(Job, reaped_job).copies_deleted_at = int(time.time())
    assert resolve(db, owner, f"{deleted}:ckpt-step-5") is None
    assert resolve(db, owner, f"{reaped}:ckpt-step-5") is None
    assert resolve(db, owner, reaped) is not None  # the ft: model outlives its run's copies


def test_a_name_with_another_org_or_base_does_not_resolve_the_job(db):
    owner = db_account(db)
    _, name = db_job_with_checkpoints(db, owner, [5])
    _, base, org, suffix = name.split(":")
    assert resolve(db, owner, f"ft:{base}:{'0' * len(org)}:{suffix}:ckpt-step-5") is None
    assert resolve(db, owner, f"ft:qwen2.5-7b-instruct:{org}:{suffix}:ckpt-step-5") is None


def test_a_parity_refused_model_makes_its_checkpoints_not_servable(db):
    owner = db_account(db)
    _, name = db_job_with_checkpoints(db, owner, [5])
    with db.session() as session:
        row = session.get(FineTunedModel, name)
        row.servable, row.reason = False, "serving_parity: the batch engine and the trainer disagree"
    found = resolve(db, owner, f"{name}:ckpt-step-5")
    assert (found.servable, found.reason) == (False, "serving_parity: the batch engine and the trainer disagree")
