"""What a running API process holds: settings and the clients built from them (no other state):
the database, the object store, and the Serve handles of the bases served online."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from openft.settings import Settings
from storage.db import Database
from storage.objects import ObjectStore, open_object_store


@dataclass
class AppState:
    settings: Settings
    db: Database
    store: ObjectStore
    now: Callable[[], int] = field(default=lambda: int(time.time()))
    # base id -> the DeploymentHandle of its online deployment (online/deployment.py); empty when the
    # app runs outside Serve (plain uvicorn), where chat completions answer model_not_available.
    online: dict[str, Any] = field(default_factory=dict)

    def file_in_use(self, session, file_id: str) -> bool:
        """Whether a running fine-tuning job reads this file (it then cannot be deleted or expire)."""
        from storage.batches import file_in_open_batch
        from storage.jobs import file_in_running_job

        # An open batch reads its input file too (issue 13).
        return file_in_running_job(session, file_id) or file_in_open_batch(session, file_id)

    @classmethod
    def from_settings(cls, settings: Settings, online: dict[str, Any] | None = None) -> "AppState":
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        return cls(
            online=dict(online or {}),
            settings=settings,
            db=Database(settings.resolved_database_url()),
            store=open_object_store(
                settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region
            ),
        )
