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
from graders.model_graders import ModelAnswer, ModelRequest
from storage.keys import ADAPTER_FILES


@dataclass(frozen=True)
class PromptRequest:
    adapter: str | None  # a name of EngineSpec.adapters; None: the base alone
    request: ModelRequest  # the grader's prompt and sampling, as graders/ made it


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
    from pathlib import Path

    from catalog.model_source import load_tokenizer, parse_model_source
    # The engine (torch, transformers) is imported by the task that runs it, not by the API, the
    # controller and the trainer's config, which import this module (catalog/model_source.py says why).
    from pipelines.generate import GenRequest, SamplingParams, load_engine, render_prompt
    from storage.objects import open_object_store

    base = get_base(spec.base_id)
    store = open_object_store(*spec.store_spec)
    adapters = {name: {f: store.get_bytes(prefix + f) for f in ADAPTER_FILES} for name, prefix in spec.adapters}
    tokenizer = load_tokenizer(base, parse_model_source(spec.model_source), Path(spec.cache_root))
    answers: list[PromptAnswer | None] = [None] * len(requests)
    runnable = []
    for key, (adapter, r) in enumerate((p.adapter, p.request) for p in requests):
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
        params = SamplingParams(min(r.max_tokens, room), r.temperature, r.top_p, r.seed, answer=r.answer)
        runnable.append(GenRequest(key, adapter, tuple(ids), params))
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


@dataclass(frozen=True)
class GradingSetup:
    """How grader models run, by value (settings `batch_engine`, `batch_engine_resources`,
    `grader_model_timeout_seconds`, ...): what evals and reinforcement jobs hand `answer_by_base`."""

    engine: str
    model_source: str
    cache_root: str
    store_spec: tuple
    max_batch_rows: int
    resources: tuple  # (resource, amount) pairs
    timeout_s: float

    @classmethod
    def of(cls, settings, store_spec: tuple) -> "GradingSetup":
        return cls(settings.batch_engine, settings.model_source, str(settings.model_cache_dir), tuple(store_spec),
                   settings.batch_max_rows_in_flight, tuple(sorted(settings.batch_engine_resources.items())),
                   settings.grader_model_timeout_seconds)


@dataclass(frozen=True)
class GradingMember:
    """One model grader's request and the model resolved for it."""

    key: int
    base_id: str
    model: str  # the name the grader gave
    adapter_prefix: str | None  # None: the base alone
    request: ModelRequest


def answer_by_base(setup: GradingSetup, members: list[GradingMember], name: str) -> dict[int, ModelAnswer]:
    """Each member's answer by its key: one `answer_on_ray` task per base, every adapter of the base's
    members loaded on it by alias; past the timeout each answer of that base says so."""
    answers: dict[int, ModelAnswer] = {}
    by_base: dict[str, list[GradingMember]] = {}
    for member in members:
        by_base.setdefault(member.base_id, []).append(member)
    for base_id, group in by_base.items():
        names = sorted({m.model for m in group if m.adapter_prefix})
        alias = {n: f"g{k}" for k, n in enumerate(names)}
        prefixes = {m.model: m.adapter_prefix for m in group if m.adapter_prefix}
        spec = GradingEngineSpec(base_id, setup.engine, setup.model_source, setup.cache_root, setup.store_spec,
                                 tuple((alias[n], prefixes[n]) for n in names), setup.max_batch_rows)
        prompts = [PromptRequest(alias.get(m.model) if m.adapter_prefix else None, m.request) for m in group]
        why = f"The grading model ran past {setup.timeout_s:g} s."
        try:
            got = answer_on_ray(spec, prompts, resources=dict(setup.resources), timeout_s=setup.timeout_s,
                                name=f"{name} {base_id}")
        except GradingTimeout:
            got = [None] * len(prompts)
        for m, answer in zip(group, got):
            answers[m.key] = (ModelAnswer(answer.text, answer.prompt_tokens, answer.completion_tokens, answer.error)
                              if answer is not None else ModelAnswer(None, error=why))
    return answers
