"""The reaper: deletes what has passed its retention, idempotently, logging counts only.

Where it sits: the API's lifespan runs `reap_once` every `reaper_interval_seconds` (each replica;
every step is safe to repeat or to run twice at once). The reference's "Your data" rules:
- uploaded and derived files: 30 days after creation (`files.expires_at`), never while an open
  job uses them;
- copies made for a training run, 7 days after the job ends: everything under `runs/{job_id}/`
  except a live model's adapter (which stays until the model is deleted), with the checkpoints
  (their adapters are models until then: jobs/model_names.py), Ray Train's run state (in the
  store too, under `runs/{job_id}/train/`), and the tokenized shards under `tokenized/{file sha256}/`.
  Shards are shared by every job on a file with those bytes, in any account, so they go only when
  no such job is open or ended less than 7 days ago (checked with a mark, so a job starting
  meanwhile is safe: storage/tokenized_reaps.py);
- jobs and their events: 180 days after they end (after their copies are gone);
- merged exports: 7 days (`merge.worker.expire_exports`, the merge worker's own rule);
- webhook deliveries and their attempts: `webhook_log_retention_days` (30) after they were delivered or failed;
- eval runs with their items, samples and grades (rows and objects under storage/keys.py
  `eval_run`): `file_retention_days` after the run was created, once it has ended, like the files
  their items came from.
"""

from __future__ import annotations

import logging

from merge.worker import expire_exports
from pipelines.tokenize import MANIFEST as TOKENIZED_MANIFEST
from serve_app.state import AppState
from storage import evals as evals_repo
from storage import files as files_repo
from storage import jobs as jobs_repo
from storage import keys
from storage import webhooks as webhooks_repo
from storage.models import Job
from storage.tokenized_reaps import mark, shards_in_use, stale_marks, unmark

log = logging.getLogger("openft.reaper")
DAY = 86400
BATCH = 500  # rows per kind per pass; the next pass takes the rest


def reap_once(state: AppState, now: int | None = None) -> dict[str, int]:
    """One pass; `now` is injectable so tests can move the clock. Returns counts by kind."""
    now = state.now() if now is None else now
    counts = {"files": _reap_files(state, now)}
    counts.update(_reap_run_copies(state, now))
    counts.update(_reap_jobs(state, now))
    counts["exports"] = expire_exports(state.db, state.store, now=now)
    counts["webhook_deliveries"] = _reap_webhook_log(state, now)
    counts["eval_runs"] = _reap_eval_runs(state, now)
    if any(counts.values()):
        log.info("reaped %s", counts)
    return counts


def _reap_webhook_log(state: AppState, now: int) -> int:
    with state.db.session() as session:
        return webhooks_repo.delete_ended_before(session, now - state.settings.webhook_log_retention_days * DAY,
                                                 limit=BATCH)


def _reap_eval_runs(state: AppState, now: int) -> int:
    with state.db.session() as session:
        expired = evals_repo.expired_runs(session, now, limit=BATCH)
        runs = [(run.account_id, run.id) for run in expired]
        for run in expired:
            evals_repo.delete_run_rows(session, run)
    for account_id, run_id in runs:  # rows first: a run whose rows are gone is never read again
        state.store.delete_prefix(keys.eval_run(account_id, run_id))
    return len(runs)


def _reap_files(state: AppState, now: int) -> int:
    with state.db.session() as session:
        object_keys = []
        for row in files_repo.expired_files(session, now, limit=BATCH):
            if state.file_in_use(session, row.id):
                continue
            row.deleted_at = now
            object_keys.append(row.object_key)
    for key in object_keys:
        state.store.delete(key)
    return len(object_keys)


def _reap_run_copies(state: AppState, now: int) -> dict[str, int]:
    cutoff = now - state.settings.run_copy_retention_days * DAY
    with state.db.session() as session:
        jobs = jobs_repo.ended_with_copies(session, cutoff, limit=BATCH)
        keep = jobs_repo.live_adapters(session, [j.id for j in jobs])
        file_ids = [f for j in jobs for f in (j.training_file, j.validation_file) if f]
        shas = {row.sha256 for row in files_repo.files_by_id(session, file_ids).values()}
        shas.update(stale_marks(session, now, BATCH))
    objects = 0
    for job in jobs:
        adapter = keep.get(job.id)
        for key in list(state.store.list(keys.run(job.id))):
            if adapter is None or not key.startswith(adapter.rstrip("/") + "/"):
                state.store.delete(key)
                objects += 1
    tokenized = 0
    for sha in sorted(shas):
        if _reap_tokenized(state, sha, cutoff, now):
            tokenized += 1
    with state.db.session() as session:
        for job in jobs:
            session.get(Job, job.id).copies_deleted_at = now
    return {"run_copies": len(jobs), "run_objects": objects, "tokenized_files": tokenized}


def _reap_tokenized(state: AppState, sha: str, cutoff: int, now: int) -> bool:
    """Delete the shards of files with these bytes if no job may still read them (see
    storage/tokenized_reaps.py for why it marks first and checks twice)."""
    with state.db.session() as session:
        if shards_in_use(session, sha, cutoff) or not mark(session, sha, now):
            return False
    try:
        with state.db.session() as session:
            if shards_in_use(session, sha, cutoff):
                return False
        found = list(state.store.list(keys.tokenized_bytes(sha)))
        for key in found:
            if key.endswith("/" + TOKENIZED_MANIFEST):
                state.store.delete(key)  # first: a reader that finds no manifest tokenizes afresh
        state.store.delete_prefix(keys.tokenized_bytes(sha))
        return bool(found)
    finally:
        with state.db.session() as session:
            unmark(session, sha)


def _reap_jobs(state: AppState, now: int) -> dict[str, int]:
    cutoff = now - state.settings.job_retention_days * DAY
    with state.db.session() as session:
        ids, events = jobs_repo.delete_ended_before(session, cutoff, limit=BATCH)
    return {"jobs": len(ids), "events": events}
