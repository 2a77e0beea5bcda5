"""The merge worker: runs merges the API queued, in the background, and ends their exports' lives.

The API (`serve_app/services/merges.py`) only records a `queued` merge; the job controller calls
`run_pending_merges` on each pass. A pass (1) marks exports past their 7 days `expired` and deletes
their objects, retrying any storage delete still owed; (2) settles `running` merges whose worker
was lost (past the deadline plus a grace, with no thread of this process on them) as a timed-out
attempt; (3) claims queued merges, one per account at a time, and runs each (`process_merge`) in
the caller's thread or, with `background=True`, in a thread of its own. An attempt that times out
is queued again until the third (`merge_attempts_exhausted`). A DELETE that arrived while a merge
ran is honoured when it ends: what it wrote is deleted and it fails `merge_weights_gone`.
"""

from __future__ import annotations

import logging
import threading
import time

from merge.errors import MergeError
from merge.run import MergeRequest, MergeResult, run_merge
from openft import metrics
from openft.settings import Settings
from storage import merges as repo
from storage.db import Database
from storage.models import FineTunedModel, Merge
from storage.objects import ObjectStore, open_object_store

log = logging.getLogger("openft.merge")

EXPORT_TTL_S = 7 * 86400
MAX_ATTEMPTS = 3
MAX_EXPORTS = 4
MAX_EXPORT_BYTES = 64 * 10**9
DAILY_MERGES = 10
# run_merge stops itself at its deadline (and waits out its tasks' cancellation); a running row
# this much older than that has lost its worker.
LOST_GRACE_S = 120

_threads: dict[str, threading.Thread] = {}
_threads_lock = threading.Lock()


def merge_request(settings: Settings, store: ObjectStore, merge: Merge, adapter_prefix: str) -> MergeRequest:
    return MergeRequest(
        base_id=merge.base,
        model_source=settings.model_source,
        cache_root=str(settings.model_cache_dir),
        store_spec=store.spec(),
        adapter_prefix=adapter_prefix,
        export_prefix=merge.export_prefix,
        deadline_s=settings.merge_deadline_seconds,
        adapter_sha256=dict(merge.adapter_sha256),
        model=merge.model,
    )


def run_pending_merges(settings: Settings, db: Database, store: ObjectStore, *, now: int,
                       background: bool = False) -> list[str]:  # fmt: skip
    """One pass; returns the ids of the merges it started. Without `background` it returns once they ended."""
    expire_exports(db, store, now=now)
    settle_lost_merges(settings, db, store, now=now)
    started = claim_pending_merges(db, now=now)
    for merge_id in started:
        if background:
            thread = threading.Thread(target=_run_thread, args=(settings, merge_id, db, store), daemon=True,
                                      name=f"merge-{merge_id}")  # fmt: skip
            with _threads_lock:
                _threads[merge_id] = thread
            thread.start()
        else:
            process_merge(settings, merge_id, db=db, store=store, now=now)
    return started


def claim_pending_merges(db: Database, *, now: int) -> list[str]:
    """Mark the oldest queued merge of each account with none running `running`; returns their ids."""
    with db.session() as session:
        busy = {m.account_id for m in repo.running_merges(session)}
        claimed = []
        for merge in repo.queued_merges(session):
            if merge.account_id in busy:
                continue
            merge.status, merge.started_at, merge.attempts = "running", now, merge.attempts + 1
            busy.add(merge.account_id)
            claimed.append(merge.id)
    return claimed


def process_merge(settings: Settings, merge_id: str, *, db: Database | None = None, store: ObjectStore | None = None,
                  now: int | None = None) -> str | None:  # fmt: skip
    """Run one claimed (`running`) merge to its next status and record it; returns that status,
    None if the merge is not running. `now` (default: the clock when it ends) stamps the outcome."""
    own_db = db is None
    db = db or Database(settings.resolved_database_url(), migrate=False)
    store = store or open_object_store(
        settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region
    )
    try:
        with db.session() as session:
            merge = repo.get_merge(session, merge_id)
            if merge is None or merge.status != "running":
                return None
            adapter_prefix = session.get(FineTunedModel, merge.model).adapter_prefix
            req = merge_request(settings, store, merge, adapter_prefix)
        started = time.monotonic()
        try:
            outcome: MergeResult | MergeError = run_merge(req, store)
            metrics.record_merge(sum(f["bytes"] for f in outcome.files), time.monotonic() - started, model=req.base_id)
        except MergeError as exc:
            outcome = exc
        with db.session() as session:
            merge = repo.get_merge(session, merge_id, for_update=True)
            return _settle(session, store, merge, outcome, int(time.time()) if now is None else now)
    finally:
        if own_db:
            db.dispose()


def settle_lost_merges(settings: Settings, db: Database, store: ObjectStore, *, now: int) -> list[str]:
    """Running merges whose worker is gone count as a timed-out attempt; returns their ids."""
    cutoff = now - int(settings.merge_deadline_seconds) - LOST_GRACE_S
    with _threads_lock:
        alive = {merge_id for merge_id, t in _threads.items() if t.is_alive()}
    settled = []
    with db.session() as session:
        for merge in repo.running_merges(session):
            if merge.id in alive or (merge.started_at or 0) > cutoff:
                continue
            lost = MergeError("merge_timeout", "The merge did not finish within its time limit and was stopped.")
            _settle(session, store, merge, lost, now)
            settled.append(merge.id)
    return settled


def expire_exports(db: Database, store: ObjectStore, *, now: int) -> int:
    """Mark exports past their 7 days `expired`, then delete every deleted or expired export's
    objects not yet deleted; returns how many exports' objects were deleted."""
    with db.session() as session:
        for merge in repo.expired_exports(session, now):
            merge.status = "expired"
        owed = [(m.id, m.export_prefix) for m in repo.unpurged_exports(session)]
    done = purge_exports(db, store, owed, now)
    if done:
        log.info("deleted %d expired or deleted exports", done)
    return done


def purge_exports(db: Database, store: ObjectStore, owed: list[tuple[str, str]], now: int) -> int:
    """Delete the objects of deleted or expired exports (`(merge id, export prefix)` pairs) and
    record it; a storage delete that fails leaves `purged_at` null, so the next pass retries it."""
    done = 0
    for merge_id, prefix in owed:
        try:
            store.delete_prefix(prefix.rstrip("/") + "/")
        except Exception as exc:
            log.error("export delete failed: %s", type(exc).__name__)
            continue
        with db.session() as session:
            repo.get_merge(session, merge_id).purged_at = now
        done += 1
    return done


def _settle(session, store: ObjectStore, merge: Merge, outcome: MergeResult | MergeError, now: int) -> str:
    """Record an attempt's outcome on the locked row; deletes an export that cannot be kept."""
    if isinstance(outcome, MergeResult):
        size = sum(f["bytes"] for f in outcome.files)
        exports, held = repo.held_exports(session, merge.account_id, now)
        if merge.delete_requested:
            outcome = MergeError("merge_weights_gone", "The export was deleted before the merge finished.")
        elif exports + 1 > MAX_EXPORTS or held + size > MAX_EXPORT_BYTES:
            outcome = MergeError(
                "merge_weights_quota",
                f"Your account already holds {exports} exports ({held / 1e9:.1f} GB); this one "
                f"({size / 1e9:.1f} GB) would pass the limit of {MAX_EXPORTS} exports or "
                f"{MAX_EXPORT_BYTES // 10**9} GB. Delete one and POST again.",
            )
        else:
            merge.status, merge.finished_at, merge.expires_at, merge.error = "succeeded", now, now + EXPORT_TTL_S, None
            merge.files, merge.bytes = outcome.files, size
            return merge.status
        store.delete_prefix(merge.export_prefix.rstrip("/") + "/")
    elif merge.delete_requested:
        outcome = MergeError("merge_weights_gone", "The export was deleted before the merge finished.")
    elif outcome.code == "merge_timeout" and merge.attempts < MAX_ATTEMPTS:
        merge.status, merge.error = "queued", {"code": outcome.code, "message": outcome.message}
        return merge.status
    elif outcome.code == "merge_timeout":
        outcome = MergeError(
            "merge_attempts_exhausted",
            f"The merge was tried {merge.attempts} times and each attempt ran past its time limit. POST again to retry.",
        )
    merge.status, merge.finished_at = "failed", now
    merge.error = {"code": outcome.code, "message": outcome.message}
    return merge.status


def _run_thread(settings: Settings, merge_id: str, db: Database, store: ObjectStore) -> None:
    try:
        process_merge(settings, merge_id, db=db, store=store)
    except Exception as exc:
        # The row stays `running`; settle_lost_merges counts it as a timed-out attempt later.
        log.error("merge %s could not be recorded: %s", merge_id, type(exc).__name__)
        raise
    finally:
        with _threads_lock:
            _threads.pop(merge_id, None)
