"""Model graders' prompts answered by a model this service runs: the batch engine
(pipelines/generate.py `load_engine`: the base once, the graders' adapters on it by name) in one
Ray task per base, as a batch's engine actors hold it.

`answer_prompts` is the task's body (pure apart from loading the model and reading the adapters
from the store): each request's messages rendered with the trainer's template code and the
generation prompt (`render_prompt`), its `max_tokens` cut to the context that is left, then one
`generate` over all of them. A request that cannot run (a template refusal, no room left in the
context) gets an error instead of text; the others still run. `answer_on_ray` runs it on the
engine's resources (`settings.batch_engine_resources`) with a timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from catalog.bases import get_base
from openft.errors import InvalidRequest
from pipelines.generate import GenRequest, SamplingParams, load_engine, render_prompt
from storage.keys import ADAPTER_FILES


@dataclass(frozen=True)
class PromptRequest:
    adapter: str | None  # a name of EngineSpec.adapters; None: the base alone
    messages: tuple[dict, ...]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None


@dataclass(frozen=True)
class PromptAnswer:
    text: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # a fixed reason, never the prompt's text


@dataclass(frozen=True)
class GradingEngineSpec:
    """What the task needs, by value: the base, where models come from, the adapters' store keys."""

    base_id: str
    kind: str
    model_source: str
    cache_root: str
    store_spec: tuple
    adapters: tuple[tuple[str, str], ...]  # (name, store prefix ending "/")
    max_batch_rows: int


def answer_prompts(spec: GradingEngineSpec, requests: list[PromptRequest]) -> list[PromptAnswer]:
    from catalog.model_source import load_tokenizer, parse_model_source
    from pathlib import Path

    from storage.objects import open_object_store

    base = get_base(spec.base_id)
    store = open_object_store(*spec.store_spec)
    adapters = {name: {f: store.get_bytes(prefix + f) for f in ADAPTER_FILES} for name, prefix in spec.adapters}
    tokenizer = load_tokenizer(base, parse_model_source(spec.model_source), Path(spec.cache_root))
    answers: list[PromptAnswer | None] = [None] * len(requests)
    runnable = []
    for key, r in enumerate(requests):
        try:
            ids = render_prompt(list(r.messages), tokenizer, base, 0)
        except InvalidRequest as exc:
            answers[key] = PromptAnswer(None, error=f"The grader's prompt cannot be rendered for {base.id} ({exc.code}).")
            continue
        room = base.max_seq_length - len(ids)
        if room < 1:
            answers[key] = PromptAnswer(None, error=f"The grader's prompt fills the {base.max_seq_length}-token context "
                                                    f"of {base.id}.")
            continue
        params = SamplingParams(min(r.max_tokens, room), r.temperature, r.top_p, r.seed)
        runnable.append(GenRequest(key, r.adapter, tuple(ids), params))
    if runnable:
        engine = load_engine(base, model_source=spec.model_source, cache_root=spec.cache_root, adapters=adapters,
                             kind=spec.kind, max_batch_rows=spec.max_batch_rows)
        for result in engine.generate(runnable):
            answers[result.key] = PromptAnswer(result.text, result.prompt_tokens, result.completion_tokens)
    return [a if a is not None else PromptAnswer(None, error="The grading model returned no answer.") for a in answers]


class GradingTimeout(Exception):
    pass


def answer_on_ray(spec: GradingEngineSpec, requests: list[PromptRequest], *, resources: dict, timeout_s: float,
                  name: str) -> list[PromptAnswer]:
    """`answer_prompts` as a Ray task on `resources`; GradingTimeout past `timeout_s` (the task is cancelled)."""
    import ray

    res = dict(resources)
    opts = {"num_cpus": res.pop("CPU", 0), "num_gpus": res.pop("GPU", 0), "resources": res or None}
    ref = ray.remote(max_retries=0)(answer_prompts).options(name=name, **opts).remote(spec, requests)
    started = time.monotonic()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        raise GradingTimeout(f"the grading model ran past {timeout_s:.0f} s ({time.monotonic() - started:.0f} s)")
    return ray.get(ref)
