"""The job package and the controller's passes on a database of each test's own: a SQLite file, or
a fresh PostgreSQL database on 127.0.0.1:5432 (where row locks really decide races).

A fresh database per test: the controller's passes act on every job they find, so a shared
database would let one test's reconcile requeue another test's jobs."""

from __future__ import annotations

import pytest

from openft.settings import Settings
from storage.db import Database

# Scripted runs (tests/worker/runs.py) store a placeholder adapter no model can load, so the serving-
# parity check (train/parity.py, tested in tests/train/test_parity.py) is off for these controllers.
NO_PARITY = {"parity_check": False}


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path):
    """A settings factory on a fresh database of either kind: backend(**overrides) -> (settings, db)."""
    url = request.getfixturevalue("fresh_pg_url") if request.param == "postgres" else None
    made: list[Database] = []

    def make(**overrides) -> tuple[Settings, Database]:
        values = {"model_source": "standin", "controller_poll_seconds": 0.05, "run_lease_seconds": 2, **NO_PARITY, **overrides}
        settings = Settings(data_dir=tmp_path / "d", database_url=url, **values)
        db = Database(settings.resolved_database_url())
        made.append(db)
        return settings, db

    make.kind = request.param
    yield make
    for db in made:
        db.dispose()


@pytest.fixture
def postgres(fresh_pg_url, tmp_path):
    """PostgreSQL only: for races that SQLite's single writer cannot show."""
    def make(**overrides) -> tuple[Settings, Database]:
        values = {"model_source": "standin", "controller_poll_seconds": 0.05, "run_lease_seconds": 2, **NO_PARITY, **overrides}
        settings = Settings(data_dir=tmp_path / "d", database_url=fresh_pg_url, **values)
        return settings, Database(settings.resolved_database_url())

    return make
