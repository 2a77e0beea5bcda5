"""What a running API process holds: settings and the clients built from them (no other state)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from openft.settings import Settings
from storage.db import Database
from storage.objects import ObjectStore, open_object_store


@dataclass
class AppState:
    settings: Settings
    db: Database
    store: ObjectStore
    now: Callable[[], int] = field(default=lambda: int(time.time()))

    def file_in_use(self, session, file_id: str) -> bool:
        """Whether a running fine-tuning job reads this file (it then cannot be deleted or expire)."""
        from storage.batches import file_in_open_batch
        from storage.jobs import file_in_running_job

        # An open batch reads its input file too (issue 13).
        return file_in_running_job(session, file_id) or file_in_open_batch(session, file_id)

    @classmethod
    def from_settings(cls, settings: Settings) -> "AppState":
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            settings=settings,
            db=Database(settings.resolved_database_url()),
            store=open_object_store(
                settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region
            ),
        )
