"""A merge's life in the background: claimed under a lease, run, settled, or lost; and the end of
its export's life.

Where it sits: the API (serve_app/services/merges.py) only records a `queued` merge; the worker's
merge pass (worker/merges.py) expires exports, loses merges nothing runs (`reconcile`), claims
(`claim_pending_merges`) and runs each claim with `process_merge` on a thread of its own.
`run_pending_merges` is the same pass run in the caller's process (the API tests, a one-off run). Every status change is a compare-and-set on
the merge's lease (storage/leases.py, `MERGE`), as for every kind of background work:

- claim: the oldest queued merge of each account with none running → `running`, leased, one
  attempt more;
- run: `merge/run.py` `run_merge` while a heartbeat renews the lease; a lost lease (or a stopping
  worker) stops it (`MergeStopped`) and nothing is recorded: whoever holds the merge now writes
  the same bytes (a merge is a pure function of the adapter and the pinned base);
- settle, proving the lease: `succeeded` (the export kept 7 days, within merge/quota.py's quota),
  or `failed` with its code; an attempt that ran past its time limit is queued again;
- lose: a merge whose worker died (its lease lapsed, or it is `running` with no lease) is queued
  again; either way, once `MERGE.max_attempts` attempts were taken it fails
  `merge_attempts_exhausted`.
A DELETE that arrived while a merge ran is honoured when it ends (or is lost): what it wrote is
deleted and it fails `merge_weights_gone`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from merge import quota
from merge.errors import MergeError, MergeStopped
from merge.run import MergeRequest, MergeResult, run_merge
from openft import metrics
from openft.settings import Settings
from storage import leases
from storage import merges as repo
from storage.context import Context
from storage.db import Database
from storage.leases import Heartbeat, Kind
from storage.models import FineTunedModel, Merge
from storage.objects import ObjectStore

log = logging.getLogger("openft.merge")

EXPORT_TTL_S = 7 * 86400
MERGE = Kind("merge", Merge, "m", max_attempts=3, exhausted_code="merge_attempts_exhausted",
             needs_lease=Merge.status == "running", pending=Merge.status == "queued")


@dataclass(frozen=True)
class Claim:
    merge_id: str
    owner: str  # the lease token every write of the merge's run proves


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


# -- the pass --------------------------------------------------------------------------------------
def run_pending_merges(settings: Settings, db: Database, store: ObjectStore, *, now: int,
                       background: bool = False) -> list[str]:  # fmt: skip
    """One pass in this process; returns the ids of the merges it started. Without `background`
    it returns once they ended; with it, each runs on a thread of its own under its heartbeat."""
    ctx = Context(settings, db, store)
    expire_exports(db, store, now=now)
    reconcile(ctx, now)
    worker = f"merges-{uuid.uuid4().hex[:8]}"
    claims = claim_pending_merges(db, now=now, new_owner=lambda: leases.new_owner(worker, MERGE),
                                  lease_s=settings.run_lease_seconds)
    for claim in claims:
        if background:
            threading.Thread(target=process_merge, args=(settings, claim), kwargs={"db": db, "store": store},
                             daemon=True, name=f"merge-{claim.merge_id}").start()
        else:
            process_merge(settings, claim, db=db, store=store, now=now)
    return [claim.merge_id for claim in claims]


def claim_pending_merges(db: Database, *, now: int, new_owner=None, lease_s: float = 30) -> list[Claim]:
    """Lease the oldest queued merge of each account with none running (`running`); returns the claims."""
    new_owner = new_owner or (lambda: leases.new_owner(f"merges-{uuid.uuid4().hex[:8]}", MERGE))

    claims = []
    with db.session() as session:
        leases.lock_scheduler(session)  # two workers' passes claim one after the other

        def ready(merge: Merge) -> str | None:  # read under the account's lock: one running merge per account
            if merge.status != "queued" or merge.deleted_at is not None:
                return f"it is {merge.status}"
            return "the account runs a merge" if repo.running_merges(session, merge.account_id) else None

        for merge_id in repo.queued_merge_ids(session):
            owner = new_owner()
            if leases.claim(session, MERGE, merge_id, owner, now, lease_s, ready).ok:
                merge = session.get(Merge, merge_id)
                merge.status, merge.started_at = "running", now
                claims.append(Claim(merge_id, owner))
    return claims


def reconcile(ctx: Context, now: int, *, alive=(), mine: str | None = None) -> list[str]:
    """Lose every merge nothing runs any more (storage/leases.py `reconcile`)."""

    def lose(session, merge: Merge, now: int) -> str:
        leases.release(merge)
        lost = MergeError("merge_interrupted", "The worker running the merge was lost; it runs again.")
        _settle(session, ctx.store, merge, lost, now)
        return merge.id

    return leases.reconcile(ctx.db, MERGE, now, alive=alive, mine=mine, lose=lose)


# -- one merge ---------------------------------------------------------------------------------------
def process_merge(settings: Settings, claim: Claim, *, db: Database | None = None, store: ObjectStore | None = None,
                  now: int | None = None, stopping: threading.Event | None = None) -> str | None:  # fmt: skip
    """Run one claimed merge to its next status and record it; returns that status, None once the
    lease is not the claim's. `now` (default: the clock when it ends) stamps the outcome."""
    own = db is None
    ctx = Context(settings, db, store) if not own else Context.from_settings(settings)
    try:
        return _process(ctx, claim, now, stopping)
    finally:
        if own:
            ctx.db.dispose()


def _process(ctx: Context, claim: Claim, now: int | None, stopping: threading.Event | None) -> str | None:
    def read():
        with ctx.db.session() as session:
            merge = repo.get_merge(session, claim.merge_id)
            if merge is None or merge.lease_owner != claim.owner:
                return None
            return merge_request(ctx.settings, ctx.store, merge, session.get(FineTunedModel, merge.model).adapter_prefix)

    req = ctx.retrying(read, "read the merge")
    if req is None:
        return None
    beat = Heartbeat(ctx.db, MERGE, claim.merge_id, claim.owner, ctx.settings.run_lease_seconds, stopping=stopping)
    started = time.monotonic()
    with beat:
        try:
            outcome: MergeResult | MergeError = run_merge(req, ctx.store, should_stop=lambda: not beat.holding())
            metrics.record_merge(sum(f["bytes"] for f in outcome.files), time.monotonic() - started, model=req.base_id)
        except MergeStopped:
            log.info("merge %s stopped: its lease is held by another worker, or this one is stopping", claim.merge_id)
            return None
        except MergeError as exc:
            outcome = exc

    def settle():
        with ctx.db.session() as session:
            merge = leases.owned(session, Merge, claim.merge_id, claim.owner)
            if merge is None:
                return None
            leases.release(merge)
            return _settle(session, ctx.store, merge, outcome, int(time.time()) if now is None else now)

    return ctx.retrying(settle, "record the merge")


def _settle(session, store: ObjectStore, merge: Merge, outcome: MergeResult | MergeError, now: int) -> str:
    """Record an attempt's outcome on the locked row; deletes an export that cannot be kept."""
    if isinstance(outcome, MergeResult):
        size = sum(f["bytes"] for f in outcome.files)
        refusal = _gone() if merge.delete_requested else quota.over_quota(session, merge.account_id, size, now)
        if refusal is None:
            merge.status, merge.finished_at, merge.expires_at, merge.error = "succeeded", now, now + EXPORT_TTL_S, None
            merge.files, merge.bytes = outcome.files, size
            return merge.status
        store.delete_prefix(merge.export_prefix.rstrip("/") + "/")
        outcome = refusal
    elif merge.delete_requested:
        outcome = _gone()
        store.delete_prefix(merge.export_prefix.rstrip("/") + "/")
    elif outcome.code in ("merge_timeout", "merge_interrupted") and not leases.exhausted(MERGE, merge):
        merge.status, merge.error = "queued", {"code": outcome.code, "message": outcome.message}
        return merge.status
    elif outcome.code in ("merge_timeout", "merge_interrupted"):
        outcome = MergeError(
            MERGE.exhausted_code,
            f"The merge was tried {merge.attempts} times and no attempt finished (each ran past its time limit or "
            "lost its worker). POST again to retry.",
        )
    merge.status, merge.finished_at = "failed", now
    merge.error = {"code": outcome.code, "message": outcome.message}
    return merge.status


def _gone() -> MergeError:
    return MergeError("merge_weights_gone", "The export was deleted before the merge finished.")


# -- exports ---------------------------------------------------------------------------------------
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
