"""One batch driven to its end, on a worker thread that holds the batch's lease.

Where it sits: the worker's batch pass (worker/batches.py) starts `drive` on a thread for each claim
of batches/scheduling.py `claim_batches`; every status change is a batches/transitions.py
compare-and-set that proves the lease, so a driver that lost its lease writes nothing, and every
database call rides through an outage of up to `db_outage_seconds` (`Context.retrying`).

Reads top to bottom:
1. stage: copy each ft:/checkpoint model's adapter files under storage/keys.py `batch_stage`. A
   model deleted while the batch runs keeps this copy until the batch ends (the reference's "Your
   data"); one deleted before the batch started is refused for its lines (404 model_not_found).
2. begin: `in_progress` (billing on: the quote's most is held, or the batch fails insufficient_quota).
3. run: pipelines/batch_ray.py `run_batch` on this thread; the lease's heartbeat (storage/leases.py)
   renews it, writes the request counts so far, and reads the status and `expires_at`, which
   `stop_reason` answers from (a cancel or the end of the completion window stops it within seconds).
4. finish: the output and error files become File rows (purpose `batch_output`; none for an empty
   file), then completed / expired / cancelled with counts, usage and the charge; the stage is deleted.

A batch cancelled or expired before it ran is closed without running (`close`): every line goes
to the error file with `batch_cancelled` / `batch_expired`, so every custom_id is accounted for once.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

import orjson
from sqlalchemy import select, update

from batches import transitions
from batches.plan import Plan
from batches.scheduling import Claim
from jobs.model_names import resolve_model
from openft import metrics
from openft.ids import batch_request_id
from openft.ids import file_id as new_file_id
from pipelines.batch_plan import LineRefusal
from pipelines.distill import iter_lines
from storage import context, keys, leases
from storage.batches import ENDED_STATUSES
from storage.files import add_file
from storage.keys import ADAPTER_FILES
from storage.leases import Heartbeat, LeaseLost
from storage.models import Batch, File
from storage.objects import ObjectNotFound

NOT_RUN = {"cancelled": ("batch_cancelled", "The batch was cancelled before this request ran."),
           "expired": ("batch_expired", "The batch's completion window ended before this request ran.")}


@dataclass
class Context(context.Context):
    stopping: threading.Event = field(default_factory=threading.Event)  # the worker is stopping


def drive(ctx: Context, claim: Claim) -> None:
    def work():
        if claim.close:
            close(ctx, claim)
        else:
            run(ctx, claim)

    def fail():
        with ctx.db.session() as session:
            transitions.fail(session, claim.batch_id, claim.owner, int(time.time()), "batch_failed",
                             "The batch failed for a platform reason. Nothing was charged: create it again.")

    def failed():
        ctx.retrying(fail, "fail the batch")
        _delete_stage(ctx, claim.batch_id)

    leases.drive(transitions.BATCH, claim.batch_id, work, failed)


# -- files ------------------------------------------------------------------------------------
def _file_row(ctx: Context, account_id: str, key: str, name: str, nbytes: int, sha256: str | None,
              now: int) -> File | None:
    """A batch's output or error file as a File row (None for an empty file: OpenAI leaves the id null)."""
    if nbytes <= 0:
        return None
    return File(id=new_file_id(), account_id=account_id, filename=name, purpose="batch_output", bytes=nbytes,
                created_at=now, created_ns=time.time_ns(),
                expires_at=now + ctx.settings.file_retention_days * 86400, status="processed",
                sha256=sha256 or "", object_key=key, stats={})


def _end(ctx: Context, claim: Claim, batch: Batch, now: int, files: list[File | None], **finish) -> None:
    """The end transition and the files' rows in one transaction: rows only if the end is recorded."""

    def end():
        with ctx.db.session() as session:
            moved = transitions.finish(session, batch.id, claim.owner, now,
                                       output_file_id=files[0].id if files[0] else None,
                                       error_file_id=files[1].id if files[1] else None, **finish)
            if moved.ok:
                for row in files:
                    if row is not None:
                        add_file(session, row)
            return moved

    moved = ctx.retrying(end, "end the batch")
    if not moved.ok and moved.status is None:
        raise LeaseLost()


def _owned(ctx: Context, claim: Claim) -> Batch:
    return ctx.retrying(lambda: leases.read_held(ctx.db, Batch, claim.batch_id, claim.owner), "read the batch")


def close(ctx: Context, claim: Claim) -> None:
    """Close a batch that never ran: every request line to the error file, then cancelled / expired."""
    batch = _owned(ctx, claim)
    code, message = NOT_RUN[claim.close]
    source_key = _input_key(ctx, batch)
    key = keys.batch_errors(batch.account_id, batch.id)
    digest, nbytes, lines = hashlib.sha256(), 0, 0
    with ctx.store.writer(key) as out:
        for raw in iter_lines(ctx.store.iter_chunks(source_key)):
            if not raw.strip():
                continue
            line = orjson.dumps({"id": batch_request_id(), "custom_id": orjson.loads(raw)["custom_id"],
                                 "response": None, "error": {"code": code, "message": message}}) + b"\n"
            out.write(line)
            digest.update(line)
            nbytes, lines = nbytes + len(line), lines + 1
    now = int(time.time())
    if nbytes == 0:
        ctx.store.delete(key)
    error_file = _file_row(ctx, batch.account_id, key, f"{batch.id}_error.jsonl", nbytes, digest.hexdigest(), now)
    _end(ctx, claim, batch, now, [None, error_file], stopped=claim.close,
         counts={"total": lines, "completed": 0, "failed": lines}, usage=None)
    _delete_stage(ctx, batch.id)  # a batch whose driver was lost mid-run staged its adapters


# -- staging ------------------------------------------------------------------------------------
def stage(ctx: Context, batch: Batch, plan: Plan) -> tuple[list[tuple[str, str | None]], dict[str, LineRefusal]]:
    """([(name, staged prefix or None for the base)], refused models added since create)."""
    models, refused = [], {}
    for i, model in enumerate(plan.models):
        if model.kind == "base":
            models.append((model.name, None))
            continue

        def resolve(name=model.name):
            with ctx.db.session() as session:
                return resolve_model(session, batch.account_id, name)

        found = ctx.retrying(resolve, "resolve a batch's model")
        target = f"{keys.batch_stage(batch.id)}m{i}/"
        try:
            if found is None or not found.servable:
                raise ObjectNotFound(model.name)
            for name in ADAPTER_FILES:
                with ctx.store.writer(target + name) as out:
                    for chunk in ctx.store.iter_chunks(found.adapter_prefix + name):
                        out.write(chunk)
        except ObjectNotFound:
            refused[model.name] = LineRefusal(
                404, "model_not_found", "The model named in body.model was deleted before the batch started.")
            continue
        models.append((model.name, target))
    return models, refused


def _delete_stage(ctx: Context, batch_id: str) -> None:
    ctx.store.delete_prefix(keys.batch_stage(batch_id))

    def record():
        with ctx.db.session() as session:
            session.execute(update(Batch).where(Batch.id == batch_id).values(stage_deleted_at=int(time.time())))

    ctx.retrying(record, "record a batch's stage deleted")


def sweep_stages(ctx: Context, limit: int = 100) -> list[str]:
    """Delete the stage of every ended batch whose driver did not (one lost twice ends in reconcile,
    which holds no store). Each worker pass calls it."""
    with ctx.db.session() as session:
        ids = session.scalars(select(Batch.id).where(Batch.status.in_(ENDED_STATUSES),
                                                     Batch.stage_deleted_at.is_(None)).limit(limit)).all()
    for batch_id in ids:
        _delete_stage(ctx, batch_id)
    return list(ids)


# -- running --------------------------------------------------------------------------------------
def heartbeat(ctx: Context, claim: Claim, total: int, counts: list[int]) -> Heartbeat:
    """The lease's heartbeat: each renewal also writes the request counts so far (`counts`:
    completed, failed) and reads what `stop_reason` answers from, within about a second."""

    def read(session) -> transitions.Seen:
        transitions.progress(session, claim.batch_id, claim.owner, total=total, completed=counts[0], failed=counts[1])
        return transitions.seen(session, claim.batch_id)

    lease_s = ctx.settings.run_lease_seconds
    return Heartbeat(ctx.db, transitions.BATCH, claim.batch_id, claim.owner, lease_s, read=read, stopping=ctx.stopping,
                     every=max(min(lease_s / 3, 1.0), 0.2))


def stop_reason(beat: Heartbeat) -> str | None:
    """Why the run stops now: `cancelled` (a cancel, or the lease lost: then its result is
    discarded), `expired`, or None."""
    if not beat.holding():
        return "cancelled"
    return beat.seen.stop_reason(time.time()) if beat.seen else None


def run(ctx: Context, claim: Claim) -> None:
    from pipelines.batch_plan import BatchModel, BatchPlan
    from pipelines.batch_ray import run_batch

    batch = _owned(ctx, claim)
    stored = Plan.from_record(batch.plan)
    models, newly_refused = stage(ctx, batch, stored)

    def begin():
        with ctx.db.session() as session:
            return transitions.begin(session, batch.id, claim.owner, int(time.time()),
                                     billing_enabled=ctx.settings.billing_enabled, quote=batch.quote)

    moved = ctx.retrying(begin, "begin the batch")
    if not moved.ok:
        _delete_stage(ctx, batch.id)
        if moved.status is None:
            raise LeaseLost()
        if moved.status == "cancelling":  # cancelled while it staged: close it without running
            close(ctx, Claim(claim.batch_id, claim.owner, "cancelled"))
        return  # else failed (insufficient_quota)
    refused = {**stored.refused_models, **newly_refused}
    plan = BatchPlan(
        batch_id=batch.id, account_id=batch.account_id, base_id=stored.base_id,
        input_key=_input_key(ctx, batch), models=tuple(BatchModel(n, p) for n, p in models),
        refused_models=refused,
        output_key=keys.batch_output(batch.account_id, batch.id), error_key=keys.batch_errors(batch.account_id, batch.id),
        shard_prefix=keys.batch_shards(batch.id), created_at=batch.created_at,
    )
    counts = [0, 0]

    def on_progress(completed: int, failed: int) -> None:
        counts[:] = (completed, failed)

    beat = heartbeat(ctx, claim, stored.lines, counts)
    if not ctx.retrying(beat.beat, "renew the batch's lease"):
        raise LeaseLost()
    started = time.monotonic()
    with beat:
        outcome = run_batch(plan, settings=ctx.settings, store_spec=ctx.store.spec(),
                            should_stop=lambda: stop_reason(beat), on_progress=on_progress)
    if not beat.holding():
        raise LeaseLost()
    metrics.record_batch(outcome.completion_tokens, time.monotonic() - started, model=plan.base_id)
    finish(ctx, claim, batch, plan, outcome)


def _input_key(ctx: Context, batch: Batch) -> str:
    def read():
        with ctx.db.session() as session:
            return session.get(File, batch.input_file_id).object_key

    return ctx.retrying(read, "read the batch's input file")


def finish(ctx: Context, claim: Claim, batch: Batch, plan, outcome) -> None:
    now = int(time.time())

    def finalizing():
        with ctx.db.session() as session:
            return transitions.begin_finalizing(session, batch.id, claim.owner, now)

    if ctx.retrying(finalizing, "finalize the batch").status is None:
        raise LeaseLost()
    files = []
    for key, name, nbytes, digest in ((plan.output_key, "output", outcome.output_bytes, outcome.output_sha256),
                                      (plan.error_key, "error", outcome.error_bytes, outcome.error_sha256)):
        if nbytes <= 0 and ctx.store.exists(key):
            ctx.store.delete(key)
        files.append(_file_row(ctx, batch.account_id, key, f"{batch.id}_{name}.jsonl", nbytes, digest, now))
    _end(ctx, claim, batch, int(time.time()), files, stopped=outcome.stopped,
         counts={"total": outcome.total, "completed": outcome.completed, "failed": outcome.failed},
         usage={"input_tokens": outcome.prompt_tokens, "output_tokens": outcome.completion_tokens,
                "by_model": outcome.usage_by_model},
         billed_tokens=outcome.prompt_tokens + outcome.completion_tokens)
    _delete_stage(ctx, batch.id)
