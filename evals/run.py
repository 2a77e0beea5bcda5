"""One eval run driven to its end, on a worker thread that holds the run's lease.

Where it sits: the worker's eval pass (worker/evals.py) starts `drive` on a thread for each claim
of evals/scheduling.py; every status change is an evals/transitions.py compare-and-set that proves
the lease, so a driver that lost its lease writes nothing, and every database call rides through
an outage (`Context.retrying`).

Reads top to bottom:
1. begin: `in_progress` (billing on: the quote's most is held at the batch rate, or the run fails
   insufficient_quota). The items are read from the run's copy (storage/keys.py `eval_run_items`);
   those a lost driver recorded already are skipped.
2. sample: a completions run's items become a batch on the batch engine (evals/samples.py); a
   jsonl run's items carry their samples. The heartbeat reads the run's status: a cancel stops the
   generation within a second, and what finished is kept.
3. grade: each criterion over every item with a sample (graders/ `grade_many`: a model criterion's
   requests go to the engine in one task per base, evals/runtime.py); a canceled run grades what it
   kept without starting a grading model.
4. record the items, then finish: counts, usage and the charge of the real tokens, from the items.
"""

from __future__ import annotations

import time

import orjson

from batches import run as batch_run
from batches.billing import quote as batch_quote
from evals import results, samples, transitions
from evals.plan import RunPlan
from evals.runtime import runtime as grading_runtime
from evals.scheduling import Claim
from graders import ModelAnswer, Runtime, grade_many, validate
from openft.ids import eval_output_item_id
from pipelines.distill import iter_lines
from storage import evals as repo
from storage import keys, leases
from storage.leases import Heartbeat, LeaseLost
from storage.models import EvalOutputItem, EvalRun

CANCELED_GRADE = "The run was canceled before this grade's model answered."


def drive(ctx: batch_run.Context, claim: Claim) -> None:
    def fail():
        with ctx.db.session() as session:
            transitions.fail(session, claim.run_id, claim.owner, int(time.time()), "eval_run_failed",
                             "The run failed for a platform reason. Nothing was charged: create it again.")

    leases.drive(transitions.EVAL_RUN, claim.run_id, lambda: run(ctx, claim),
                 lambda: ctx.retrying(fail, "fail the eval run"))


def _owned(ctx: batch_run.Context, claim: Claim) -> EvalRun:
    return ctx.retrying(lambda: leases.read_held(ctx.db, EvalRun, claim.run_id, claim.owner), "read the eval run")


def _todo(ctx: batch_run.Context, row: EvalRun) -> dict[int, dict]:
    def recorded():
        with ctx.db.session() as session:
            return repo.item_indices(session, row.id)

    done = ctx.retrying(recorded, "read the run's recorded items")
    lines = iter_lines(ctx.store.iter_chunks(keys.eval_run_items(row.account_id, row.id)))
    return {i: orjson.loads(raw) for i, raw in enumerate(line for line in lines if line.strip()) if i not in done}


def heartbeat(ctx: batch_run.Context, claim: Claim) -> Heartbeat:
    lease_s = ctx.settings.run_lease_seconds
    return Heartbeat(ctx.db, transitions.EVAL_RUN, claim.run_id, claim.owner, lease_s,
                     read=lambda session: repo.run_status(session, claim.run_id), stopping=ctx.stopping,
                     every=max(min(lease_s / 3, 1.0), 0.2))


def stop_reason(beat: Heartbeat) -> str | None:
    """`cancelled` (batch_ray's word) once the run is canceled or the lease is lost, else None."""
    return "cancelled" if not beat.holding() or beat.seen == "canceled" else None


def run(ctx: batch_run.Context, claim: Claim) -> None:
    row = _owned(ctx, claim)
    plan = RunPlan.from_record(row.plan)
    settings = ctx.settings
    quote = batch_quote(settings, plan.rate_base_id, plan.tokens_upper_bound) \
        if settings.billing_enabled and plan.rate_base_id else None

    def begin():
        with ctx.db.session() as session:
            return transitions.begin(session, row.id, claim.owner, int(time.time()),
                                     billing_enabled=settings.billing_enabled, quote=quote)

    moved = ctx.retrying(begin, "begin the eval run")
    if not moved.ok:
        if moved.status is None:
            raise LeaseLost()
        return  # failed (insufficient_quota) or canceled while it waited
    todo = _todo(ctx, row)
    beat = heartbeat(ctx, claim)
    if not ctx.retrying(beat.beat, "renew the eval run's lease"):
        raise LeaseLost()
    with beat:
        if plan.sampling is not None and todo:
            made, _ = samples.generate(ctx, row, plan, todo, lambda: stop_reason(beat))
        else:
            made = {i: samples.given(item) for i, item in todo.items()}
        if not beat.holding():
            raise LeaseLost()
        canceled = beat.seen == "canceled"
        runtime = runtime_for(ctx, row, canceled)
        items = graded(row, todo, made, runtime)
        if not beat.holding():
            raise LeaseLost()
    record_and_finish(ctx, claim, row, plan, items)


def runtime_for(ctx: batch_run.Context, row: EvalRun, canceled: bool) -> Runtime:
    full = grading_runtime(ctx.db, tuple(ctx.store.spec()), ctx.settings, row.account_id)
    if not canceled:
        return full
    return Runtime(model_call=lambda requests: [ModelAnswer(None, error=CANCELED_GRADE)] * len(requests),
                   sandbox=full.sandbox)


def graded(row: EvalRun, todo: dict[int, dict], made: dict[int, samples.Sample], runtime: Runtime) -> list:
    """The output items of every item that has a sample or its error, graded by every criterion."""
    now, order = int(time.time()), sorted(made)
    graders = [validate(c, f"testing_criteria[{k}]") for k, c in enumerate(row.criteria)]
    graded = [i for i in order if not made[i].errored]
    by_criterion = [dict(zip(graded, grade_many(g, [(made[i].namespace, todo[i]["item"]) for i in graded], runtime)))
                    for g in graders]
    out = []
    for i in order:
        sample = made[i]
        found = [] if sample.errored else [results.result(g, grades[i]) for g, grades in zip(graders, by_criterion)]
        out.append(EvalOutputItem(
            id=eval_output_item_id(), account_id=row.account_id, run_id=row.id, eval_id=row.eval_id, item_index=i,
            item=todo[i]["item"], sample=sample.wire, results=found, status=results.item_status(found, sample.errored),
            created_at=now, created_ns=time.time_ns()))
    return out


def record_and_finish(ctx: batch_run.Context, claim: Claim, row: EvalRun, plan: RunPlan, items: list) -> None:
    names = [c["name"] for c in row.criteria]

    def end():
        with ctx.db.session() as session:
            if not transitions.record(session, row.id, claim.owner, items):
                return None
            session.flush()
            kept = repo.all_items(session, row.id)
            usage = results.usage(plan.sampling.model if plan.sampling else "", [(k.sample, k.results) for k in kept])
            return transitions.finish(
                session, row.id, claim.owner, int(time.time()), counts=results.counts([k.status for k in kept]),
                per_criteria=results.per_criteria(names, [(k.status, k.results) for k in kept]), usage=usage,
                billed_tokens=results.billed_tokens(usage))

    moved = ctx.retrying(end, "record the eval run's items")
    if moved is None or moved.status is None:
        raise LeaseLost()
