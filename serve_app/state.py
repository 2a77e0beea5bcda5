"""What a running API process holds: settings and the clients built from them (no other state),
and the Serve handles of the bases served online. It is the `Context` every service below the API
takes (storage/context.py), so the API passes its own state down unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.context import Context


@dataclass
class AppState(Context):
    # base id -> the DeploymentHandle of its online deployment (online/deployment.py); empty when the
    # app runs outside Serve (plain uvicorn), where chat completions answer model_not_available.
    online: dict[str, Any] = field(default_factory=dict)

    def file_in_use(self, session, file_id: str) -> bool:
        """Whether a running fine-tuning job reads this file (it then cannot be deleted or expire)."""
        from storage.batches import file_in_open_batch
        from storage.jobs import file_in_running_job

        # An open batch reads its input file too (issue 13).
        return file_in_running_job(session, file_id) or file_in_open_batch(session, file_id)
