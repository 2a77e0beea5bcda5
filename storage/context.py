"""What a process of the service holds to do its work: the settings and the clients built from
them (the database, the object store) and a clock. Built once at an entry point (an API replica,
the worker actor) and passed down explicitly; below the API it is all a service function needs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from openft.settings import Settings
from storage.db import Database
from storage.objects import ObjectStore, open_object_store

T = TypeVar("T")


@dataclass
class Context:
    settings: Settings
    db: Database
    store: ObjectStore
    now: Callable[[], int] = field(default=lambda: int(time.time()))

    def retrying(self, work: Callable[[], T], what: str) -> T:
        """`work` (which opens its own sessions), retried through a database outage of up to
        `db_outage_seconds` (storage/db.py `Database.retrying`)."""
        return self.db.retrying(work, budget_s=self.settings.db_outage_seconds, what=what)

    @classmethod
    def from_settings(cls, settings: Settings, **kw):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return cls(settings=settings, db=Database(settings.resolved_database_url()), store=open_store(settings), **kw)


def open_store(settings: Settings) -> ObjectStore:
    return open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                             s3_region=settings.s3_region)
