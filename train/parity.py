"""The serving-parity check at registration: before an `ft:` model is marked servable, greedy
completions of a few held-out prompts must agree three ways, and end their turns.

Where it sits: the worker's run supervision (worker/runs.py `conclude`) runs `check_parity` after
the run succeeded and before jobs/registration.py `register`, which records the figures in
`gridline.fine_tuned_adapter` and registers the model servable only if the check passed.

The three paths, greedy (temperature 0), on the same prompt ids and `max_tokens`:
- served: the batch engine (pipelines/generate.py `load_engine`) with the adapter loaded on the
  base from its stored files, as a batch runs it;
- merged: the base with `W + B·A × lora_alpha / r` merged in by merge/ (train/_parity_models.py);
- trained: the training-time model, peft's LoRA built with the job's own rank and alpha and the
  adapter's tensors loaded, unmerged: the reference both others are compared with.

Prompts are held-out rows, never trained on: the validation file's first rows, or the training
file's holdout (train/data.py `holdout_lines`, the trainer's own rule); each row's conversation up
to its last assistant turn (a preference row's `input.messages`; a reinforcement row's `messages`,
which are all prompt), rendered by the trainer's template code with the generation prompt. Each
completion may take twice its row's answer plus 16 tokens (a reinforcement row has no answer: the
job's `max_completion_tokens`), at most `parity_max_tokens`, within the job's `max_seq_length`.

Agreement rule: tokens are compared position by position; at the first position where a path's
token differs from the reference's, the reference model's logits price the difference: the margin
`logit[reference token] - logit[path token]`. At or below `parity_logit_tolerance` it is a float
tie (bf16 rounding of the merged weights, another kernel's summation order: on random stand-in
weights near-ties are common), and the row counts as agreed up to there (the continuations of a
tie may part legitimately). Above it the paths disagree, and the model is not servable. A wrong
scale, another template or a broken merge moves logits by whole units on the first token.

End of turn: every completion of every path must close with the base's end-of-turn token before
its token budget runs out; a fine-tune that does not stop would run every batch line to max_tokens.

Failures register the model `servable: false` with a `reason` that names the check
(`parity_served_mismatch`, `parity_merged_mismatch`, `parity_end_of_turn`), and the job still
succeeds with `fine_tuned_model` null (the reference: it "stays null until the adapter is
servable"; the adapter stays downloadable). A check that cannot run (an exception, its timeout) is
not a training failure either: `parity_check_error`, not servable, the exception's class name
recorded (never its message, which may quote a row).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from catalog.bases import BaseModelSpec, get_base
from storage.keys import ADAPTER_FILES
from train.data import holdout_lines

log = logging.getLogger("openft.parity")
ANSWER_SLACK = 16


@dataclass(frozen=True)
class ParityRequest:
    """Everything the check needs, as plain values: it runs as a Ray task, on any node."""

    job_id: str
    base_id: str
    model_source: str  # Settings.model_source
    cache_root: str
    store_spec: tuple  # ObjectStore.spec()
    adapter_prefix: str  # ends "/": adapter_model.safetensors, adapter_config.json
    lora_rank: int  # the job's: the training-time model is built from these, not from adapter_config.json
    lora_alpha: int
    method_type: str  # supervised | dpo | reinforcement (a preference row's prompt is input.messages)
    max_seq_length: int
    prompts_key: str  # object key of the validation file, or of the training file (holdout)
    holdout_seed: int | None  # None: prompts_key is the validation file, every row held out
    prompts: int
    max_tokens: int
    tolerance: float
    engine_kind: str = "transformers"
    answer_tokens: int | None = None  # reinforcement: the job's max_completion_tokens (its rows have no answer)


@dataclass(frozen=True)
class Prompt:
    line: int
    ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Comparison:
    compared: int  # positions whose tokens were compared (up to and including a tie)
    identical: bool
    margin: float | None  # the reference's logit margin at the first differing position
    position: int | None


def parity_request(job, validation_key: str | None, training_key: str, adapter_prefix: str, settings, store_spec) -> ParityRequest:
    """The request for `job` (a storage Job row, spec as stored) from the controller's settings."""
    from jobs.spec import JobSpec

    spec = JobSpec.from_record(job.spec)
    return ParityRequest(
        job_id=job.id, base_id=spec.model, model_source=settings.model_source, cache_root=str(settings.model_cache_dir),
        store_spec=store_spec, adapter_prefix=adapter_prefix.rstrip("/") + "/", lora_rank=spec.lora_rank,
        lora_alpha=spec.lora_alpha, method_type=spec.method_type, max_seq_length=spec.max_seq_length,
        prompts_key=validation_key or training_key, holdout_seed=None if validation_key else spec.seed,
        prompts=settings.parity_prompts, max_tokens=settings.parity_max_tokens,
        tolerance=settings.parity_logit_tolerance, engine_kind=settings.batch_engine,
        answer_tokens=spec.max_completion_tokens,
    )


# -- held-out prompts -------------------------------------------------------------------------
def held_out_lines(store, key: str, seed: int | None) -> list[int]:
    """Candidate line numbers in order: the holdout of a training file (as the trainer draws it
    from its row count), or every line of a validation file."""
    rows = sum(1 for line in _lines(store, key) if line.strip())
    if seed is None:
        return list(range(1, rows + 1))
    return sorted(holdout_lines(rows, seed)) if rows else []


def _lines(store, key: str):
    rest = b""
    for chunk in store.iter_chunks(key):
        rest += chunk
        *whole, rest = rest.split(b"\n")
        yield from whole
    if rest:
        yield rest


def prompt_and_answer(row: dict, method_type: str) -> tuple[list[dict], str | None]:
    """The conversation up to the row's last assistant turn, and that turn's content (None: a
    reinforcement row, all prompt)."""
    if method_type == "reinforcement":
        return row["messages"], None
    if method_type == "dpo":
        return row["input"]["messages"], str(row["preferred_output"][0].get("content") or "")
    messages = row["messages"]
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    return messages[:last], str(messages[last].get("content") or "")


def held_out_prompts(req: ParityRequest, store, tokenizer, base: BaseModelSpec) -> list[Prompt]:
    from pipelines.generate import render_prompt

    wanted = held_out_lines(store, req.prompts_key, req.holdout_seed)
    picked, out = set(wanted), []
    for n, raw in enumerate(_lines(store, req.prompts_key), start=1):
        if n not in picked or not raw.strip():
            continue
        messages, answer = prompt_and_answer(orjson.loads(raw), req.method_type)
        ids = render_prompt(messages, tokenizer, base, n)
        room = req.max_seq_length - len(ids)
        wanted = (req.answer_tokens if answer is None
                  else 2 * len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + ANSWER_SLACK)
        budget = min(req.max_tokens, wanted, room)
        if budget >= 1:  # a prompt that fills the context cannot be answered: the next row is used
            out.append(Prompt(n, tuple(ids), budget))
        if len(out) == req.prompts:
            break
    return out


# -- the rule -----------------------------------------------------------------------------------
def compare(reference, tokens: tuple[int, ...]) -> Comparison:
    """`tokens` against the reference `Completion` (see the module docstring for the rule)."""
    ref = reference.tokens
    for i in range(min(len(ref), len(tokens))):
        if ref[i] != tokens[i]:
            ids, logits = reference.top_ids[i], reference.top_logits[i]
            # Outside the reference's top-k, the k-th logit bounds the margin from below.
            other = logits[ids.index(tokens[i])] if tokens[i] in ids else logits[-1]
            return Comparison(i + 1, False, logits[0] - other, i)
    if len(ref) != len(tokens):  # one ran on where the other had stopped: never a tie
        return Comparison(min(len(ref), len(tokens)), False, float("inf"), min(len(ref), len(tokens)))
    return Comparison(len(ref), True, None, None)


def decide(comparisons: dict[str, list[Comparison]], ends: list[bool], tolerance: float, eot_token: str,
           budgets: list[int]) -> tuple[str | None, str | None]:
    """(code, reason) of the first failed check, or (None, None)."""
    for path, what in (("merged", "the merged weights"), ("served", "the batch engine")):
        for n, c in enumerate(comparisons.get(path, []), start=1):
            if c.margin is not None and c.margin > tolerance:
                margin = "a different length" if c.margin == float("inf") else f"a logit margin of {c.margin:.3g}"
                return f"parity_{path}_mismatch", (
                    f"Serving-parity check parity_{path}_mismatch: on held-out prompt {n}, {what} chose another greedy "
                    f"token than the training-time model at position {c.position + 1} ({margin}, tolerance "
                    f"{tolerance:g}), so batches would not answer as the model trained. Download the adapter.")
    missing = sum(not e for e in ends)
    if missing:
        return "parity_end_of_turn", (
            f"Serving-parity check parity_end_of_turn: {missing} of {len(ends)} greedy completions of held-out prompts "
            f"did not end with {eot_token} within their budget (up to {max(budgets)} tokens), so batch answers would "
            "run to max_tokens: the model has not learned to end its turns yet. Train more epochs (n_epochs) or with a "
            "higher learning_rate_multiplier, or download the adapter.")
    return None, None


# -- the check ------------------------------------------------------------------------------------
def run_parity(req: ParityRequest) -> dict:
    """The check itself (the Ray task's body): the figures, with `servable` and `reason`."""
    import torch

    from catalog.model_source import load_tokenizer, parse_model_source
    from pipelines.engine import GenRequest, SamplingParams, end_of_turn_ids
    from pipelines.generate import load_engine
    from storage.objects import open_object_store
    from train._parity_models import greedy, merged_model, training_model

    started = time.monotonic()
    base = get_base(req.base_id)
    store = open_object_store(*req.store_spec)
    cache = Path(req.cache_root)
    tokenizer = load_tokenizer(base, parse_model_source(req.model_source), cache)
    stop_id = end_of_turn_ids(tokenizer, base)[0]
    files = {name: store.get_bytes(req.adapter_prefix + name) for name in ADAPTER_FILES}
    prompts = held_out_prompts(req, store, tokenizer, base)
    if not prompts:
        raise ValueError("no held-out row could be prompted")
    torch.manual_seed(0)

    trained = training_model(base, req.model_source, cache, files["adapter_model.safetensors"], req.lora_rank, req.lora_alpha)
    reference = [greedy(trained, list(p.ids), p.max_tokens, stop_id) for p in prompts]
    del trained
    workdir = Path(tempfile.mkdtemp(prefix=f"parity-{req.job_id}-"))
    try:
        merged = merged_model(base, req.model_source, cache, files["adapter_config.json"], files["adapter_model.safetensors"], workdir)
        merged_out = [greedy(merged, list(p.ids), p.max_tokens, stop_id) for p in prompts]
        del merged
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    engine = load_engine(base, model_source=req.model_source, cache_root=req.cache_root, adapters={"ft": files},
                         kind=req.engine_kind, max_batch_rows=len(prompts))
    served = engine.generate([GenRequest(i, "ft", p.ids, SamplingParams(max_tokens=p.max_tokens, temperature=0.0))
                              for i, p in enumerate(prompts)])
    served_tokens = [r.token_ids for r in sorted(served, key=lambda r: r.key)]
    del engine

    comparisons = {
        "merged": [compare(r, m.tokens) for r, m in zip(reference, merged_out)],
        "served": [compare(r, s) for r, s in zip(reference, served_tokens)],
    }
    all_tokens = [r.tokens for r in reference] + [m.tokens for m in merged_out] + served_tokens
    ends = [bool(t) and t[-1] == stop_id for t in all_tokens]
    code, reason = decide(comparisons, ends, req.tolerance, base.end_of_turn, [p.max_tokens for p in prompts])
    return {
        "servable": code is None, "reason": reason,
        "parity": {
            "passed": code is None, "check": code, "prompts": len(prompts), "prompt_lines": [p.line for p in prompts],
            "held_out_from": "holdout" if req.holdout_seed is not None else "validation_file",
            "tokens_generated": sum(len(r.tokens) for r in reference),
            "paths": {path: _path_figures(cs, req.tolerance) for path, cs in comparisons.items()},
            "max_logit_gap": max((c.margin for cs in comparisons.values() for c in cs
                                  if c.margin is not None and c.margin != float("inf")), default=0.0),
            "max_merged_logit_diff": _max_logit_diff(reference, merged_out),
            "logit_tolerance": req.tolerance, "eot_ok": all(ends), "eot_completions": sum(ends),
            "completions": len(ends), "engine": req.engine_kind,
            "seconds": round(time.monotonic() - started, 3),
        },
    }


def _path_figures(comparisons: list[Comparison], tolerance: float) -> dict:
    return {
        "tokens_compared": sum(c.compared for c in comparisons),
        "identical": sum(c.identical for c in comparisons),
        "tied": sum(c.margin is not None and c.margin <= tolerance for c in comparisons),
        "agree": all(c.margin is None or c.margin <= tolerance for c in comparisons),
    }


def _max_logit_diff(reference, merged) -> float:
    """Largest |logit| difference of the chosen token between merged and trained, where they agree."""
    diffs = [abs(r.top_logits[i][0] - m.top_logits[i][0]) for r, m in zip(reference, merged)
             for i in range(min(len(r.tokens), len(m.tokens))) if r.tokens[: i + 1] == m.tokens[: i + 1]]
    return max(diffs, default=0.0)


def parity_error(exc_name: str, seconds: float) -> dict:
    return {
        "servable": False,
        "reason": f"Serving-parity check parity_check_error: the check could not run ({exc_name}), so the model is "
                  "not offered for batches. Download the adapter, or run the job again.",
        "parity": {"passed": False, "check": "parity_check_error", "error": exc_name, "seconds": round(seconds, 3)},
    }


def check_parity(req: ParityRequest, *, resources: dict, timeout_s: float, keep_going: Callable[[], bool]) -> dict:
    """Run `run_parity` as a Ray task on `resources`, calling `keep_going` (the caller's lease
    heartbeat) about once a second; returns its figures, or `parity_error` figures when the task
    raised or ran past `timeout_s`. Raises `ParityAbandoned` when `keep_going` says stop."""
    import ray
    from ray.exceptions import RayError, RayTaskError

    res = dict(resources)
    opts = {"num_cpus": res.pop("CPU", 0), "num_gpus": res.pop("GPU", 0), "resources": res or None}
    ref = ray.remote(max_retries=0)(run_parity).options(name=f"{req.job_id} parity", **opts).remote(req)
    started = time.monotonic()
    while True:
        ready, _ = ray.wait([ref], timeout=1.0)
        if ready:
            try:
                return ray.get(ref)
            except RayTaskError as exc:
                cause = type(exc.cause).__name__ if exc.cause is not None else "RayTaskError"
                log.warning("parity check of %s raised %s", req.job_id, cause)
                return parity_error(cause, time.monotonic() - started)
            except RayError as exc:  # the task's worker died: not the adapter's fault
                return parity_error(type(exc).__name__, time.monotonic() - started)
        if not keep_going():
            ray.cancel(ref, force=True)
            raise ParityAbandoned()
        if time.monotonic() - started > timeout_s:
            ray.cancel(ref, force=True)
            log.warning("parity check of %s ran past %.0f s", req.job_id, timeout_s)
            return parity_error("TimeoutError", time.monotonic() - started)


class ParityAbandoned(Exception):
    """The caller's lease is gone: the check was stopped and nothing may be recorded."""

