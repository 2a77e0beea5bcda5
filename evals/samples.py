"""A completions run's samples, generated as a batch is: the items become a batch input file of
chat requests (the run's `input_messages` rendered over each item), which pipelines/batch_ray.py
`run_batch` runs on the batch engine, with the batch's per-line error handling (a request that
cannot run is an error line with its code, and the others still run) and its stop (a cancel keeps
what finished). A jsonl run's items carry their samples. Either way each item gets a `Sample`: the
namespace its graders read and OpenAI's output-item `sample`.

Where it sits: evals/run.py calls `generate` (on its driver thread, under the run's lease) or
`given`; the model's adapter files are staged as a batch's are (batches/run.py `stage`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from batches import run as batch_run
from batches.plan import Plan, PlannedModel
from evals.plan import RunPlan, Sampling
from graders import sample_namespace
from graders.templates import lookup, parse_reference, render
from pipelines.distill import iter_lines
from storage import keys


@dataclass(frozen=True)
class Sample:
    namespace: dict | None  # what {{sample.*}} reads; None: there is no sample (see `error`)
    wire: dict  # OpenAI's EvalRun output item `sample`
    tokens: tuple[int, int] = (0, 0)  # prompt, completion (the sampled model's usage for this item)

    @property
    def errored(self) -> bool:
        return self.namespace is None


def _wire(model: str, messages: list, text: str | None, *, finish: str = "", usage=(0, 0), error: dict | None = None,
          sampling: Sampling | None = None) -> dict:
    return {"model": model, "input": [{"role": m.get("role", ""), "content": str(m.get("content", ""))} for m in messages],
            "output": [] if text is None else [{"role": "assistant", "content": text}], "finish_reason": finish,
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage),
                      "cached_tokens": 0},
            "error": error, "temperature": sampling.temperature if sampling else 0.0,
            "top_p": sampling.top_p if sampling else 1.0,
            "max_completion_tokens": (sampling.max_tokens or 0) if sampling else 0,
            "seed": (sampling.seed or 0) if sampling else 0}


def given(row: dict) -> Sample:
    """A jsonl item's own sample: its output_text (and anything else it carries) as the namespace."""
    sample = row["sample"]
    text = sample.get("output_text")
    text = text if isinstance(text, str) else ""
    return Sample({**sample_namespace(text), **sample}, _wire(str(sample.get("model", "")), [], text))


def messages_for(sampling: Sampling, item: dict) -> list | None:
    """The chat messages of one item (None: its item_reference is not a list; the line says so)."""
    if sampling.template is not None:
        return [{"role": m["role"], "content": render(m["content"], None, item)} for m in sampling.template]
    found = lookup(item, parse_reference(sampling.item_reference, "item_reference").path)
    return found if isinstance(found, list) else None


def _request(index: int, sampling: Sampling, messages) -> bytes:
    body = {"model": sampling.model, "messages": messages if messages is not None else "not a list",
            "temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.max_tokens is not None:
        body["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return orjson.dumps({"custom_id": str(index), "method": "POST", "url": "/v1/chat/completions", "body": body})


def generate(ctx: batch_run.Context, run, plan: RunPlan, items: dict[int, dict],
             should_stop: Callable[[], str | None]) -> tuple[dict[int, Sample], str | None]:
    """Every item's sample ({index: Sample}; items a cancel left unrun are absent) and why it
    stopped (None: every item ran). `run` is the run's row (detached): its ids."""
    from pipelines.batch_plan import BatchModel, BatchPlan
    from pipelines.batch_ray import run_batch

    sampling = plan.sampling
    gen = lambda name: keys.eval_run_generation(run.account_id, run.id, name)  # noqa: E731
    messages = {i: messages_for(sampling, row["item"]) for i, row in items.items()}
    with ctx.store.writer(gen("requests")) as out:
        for i in items:
            out.write(_request(i, sampling, messages[i]) + b"\n")
    # Staged as a batch's models are (resolved again by name: one deleted since create is refused).
    staged, refused = batch_run.stage(ctx, run, Plan(
        sampling.base_id, (PlannedModel(sampling.model, sampling.model_kind, None),), {}, len(items), 0))
    batch_plan = BatchPlan(batch_id=run.id, account_id=run.account_id, base_id=sampling.base_id,
                           input_key=gen("requests"), models=tuple(BatchModel(n, p) for n, p in staged),
                           refused_models=refused, output_key=gen("output"), error_key=gen("errors"),
                           shard_prefix=keys.eval_run_shards(run.account_id, run.id), created_at=run.created_at)
    try:
        outcome = run_batch(batch_plan, settings=ctx.settings, store_spec=ctx.store.spec(), should_stop=should_stop)
        samples: dict[int, Sample] = {}
        for key in (gen("output"), gen("errors")):
            if not ctx.store.exists(key):
                continue
            for raw in iter_lines(ctx.store.iter_chunks(key)):
                if raw.strip():
                    index, sample = _read(orjson.loads(raw), sampling, messages)
                    if sample is not None:
                        samples[index] = sample
    finally:
        ctx.store.delete_prefix(keys.batch_stage(run.id))
        ctx.store.delete_prefix(keys.eval_run_generated(run.account_id, run.id))
    return samples, outcome.stopped


def _read(line: dict, sampling: Sampling, messages: dict[int, list | None]) -> tuple[int, Sample | None]:
    index = int(line["custom_id"])
    shown = messages[index] or []
    response = line.get("response")
    if response is None:  # not run: the run was canceled before this item; it is not recorded
        return index, None
    body = response["body"]
    if response["status_code"] != 200:
        error = body["error"]
        wire = _wire(sampling.model, shown, None, error={"code": error["code"], "message": error["message"]},
                     sampling=sampling)
        return index, Sample(None, wire)
    choice = body["choices"][0]
    text = choice["message"]["content"] or ""
    usage = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    namespace = sample_namespace(text, choices=body["choices"])
    return index, Sample(namespace, _wire(sampling.model, shown, text, finish=choice["finish_reason"], usage=usage,
                                          sampling=sampling), usage)

