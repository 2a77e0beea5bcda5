"""What a running API process holds: settings and the clients built from them (no other state).
It is the `Context` every service below the API takes (storage/context.py), so the API passes its
own state down unchanged."""

from __future__ import annotations

from storage.context import Context


class AppState(Context):
    def file_in_use(self, session, file_id: str) -> bool:
        """Whether a running fine-tuning job reads this file (it then cannot be deleted or expire)."""
        from storage.batches import file_in_open_batch
        from storage.jobs import file_in_running_job

        # An open batch reads its input file too (issue 13).
        return file_in_running_job(session, file_id) or file_in_open_batch(session, file_id)
