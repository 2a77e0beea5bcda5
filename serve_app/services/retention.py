"""The reaper: deletes what has passed its retention, idempotently, logging counts only."""

from __future__ import annotations

import logging

from serve_app.state import AppState
from storage import files as files_repo

log = logging.getLogger("openft.reaper")


def reap_once(state: AppState, now: int | None = None) -> dict[str, int]:
    """One pass; `now` is injectable so tests can move the clock. Returns counts by kind."""
    now = state.now() if now is None else now
    counts = {"files": 0}
    with state.db.session() as session:
        expired = files_repo.expired_files(session, now)
        keys = []
        for row in expired:
            if state.file_in_use(session, row.id):
                continue
            row.deleted_at = now
            keys.append(row.object_key)
    for key in keys:
        state.store.delete(key)
    counts["files"] = len(keys)
    if any(counts.values()):
        log.info("reaped %s", counts)
    return counts
