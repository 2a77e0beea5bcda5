"""The graders' runtime the service supplies (graders/ runs no model and reads no settings): the
caller's models for score_model / label_model criteria, resolved as a batch line's model is
(jobs/model_names.py), answered by the batch engine in one Ray task per base
(pipelines/model_grading.py), and the python sandbox's limits from settings.

Where it sits: the grader endpoints (serve_app/services/graders.py) and an eval run's driver
(evals/run.py) both build their `Runtime` here, so a grade is the same whichever asks for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graders import ModelAnswer, ModelRequest, Runtime
from graders.sandbox import SandboxLimits
from jobs.model_names import ResolvedModel, model_checker, resolve_model
from openft.settings import Settings
from pipelines.model_grading import GradingEngineSpec, GradingTimeout, PromptRequest, answer_on_ray
from storage.db import Database


def sandbox_limits(settings: Settings) -> SandboxLimits:
    return SandboxLimits(wall_seconds=settings.grader_python_wall_seconds, cpu_seconds=settings.grader_python_cpu_seconds,
                         memory_bytes=settings.grader_python_memory_bytes, disk_bytes=settings.grader_python_disk_bytes,
                         max_processes=settings.grader_python_max_processes)


def _resolve(db: Database, account_id: str, name: str) -> ResolvedModel | None:
    with db.session() as session:
        return resolve_model(session, account_id, name)


def model_call(db: Database, store_spec: tuple, settings: Settings,
               account_id: str) -> Callable[[Sequence[ModelRequest]], list[ModelAnswer]]:
    def call(requests: Sequence[ModelRequest]) -> list[ModelAnswer]:
        answers: list[ModelAnswer | None] = [None] * len(requests)
        by_base: dict[str, list[tuple[int, ResolvedModel]]] = {}
        for i, request in enumerate(requests):
            resolved = _resolve(db, account_id, request.model)  # deleted since validation: answered, not raised
            if resolved is None or not resolved.servable:
                answers[i] = ModelAnswer(None, error="The grading model is no longer available.")
                continue
            by_base.setdefault(resolved.base_id, []).append((i, resolved))
        for base_id, members in by_base.items():
            names = sorted({m.name for _, m in members if m.adapter_prefix})
            alias = {name: f"g{k}" for k, name in enumerate(names)}
            prefixes = {m.name: m.adapter_prefix for _, m in members if m.adapter_prefix}
            spec = GradingEngineSpec(base_id, settings.batch_engine, settings.model_source, str(settings.model_cache_dir),
                                     tuple(store_spec), tuple((alias[n], prefixes[n]) for n in names),
                                     settings.batch_max_rows_in_flight)
            prompts = [PromptRequest(alias.get(m.name) if m.adapter_prefix else None, requests[i].messages,
                                     requests[i].max_tokens, requests[i].temperature, requests[i].top_p,
                                     requests[i].seed) for i, m in members]
            try:
                got = answer_on_ray(spec, prompts, resources=settings.batch_engine_resources,
                                    timeout_s=settings.grader_model_timeout_seconds, name=f"grader model {base_id}")
            except GradingTimeout:
                got = [None] * len(prompts)
                why = f"The grading model ran past {settings.grader_model_timeout_seconds:g} s."
            for (i, _), answer in zip(members, got):
                answers[i] = (ModelAnswer(answer.text, answer.prompt_tokens, answer.completion_tokens, answer.error)
                              if answer is not None else ModelAnswer(None, error=why))
        return answers  # type: ignore[return-value]

    return call


def runtime(db: Database, store_spec: tuple, settings: Settings, account_id: str) -> Runtime:
    return Runtime(model_call=model_call(db, store_spec, settings, account_id), sandbox=sandbox_limits(settings))
