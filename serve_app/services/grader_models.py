"""The model graders' models, for the service: who may use which model (`model_checker`) and the
`ModelCall` that answers graders/ requests with the batch engine (pipelines/model_grading.py, one
Ray task per base, adapters loaded by name). A base, or the caller's own servable ft: model or
checkpoint, resolved by jobs/model_names.py like a batch line's model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graders import ModelAnswer, ModelRequest
from jobs.model_names import ResolvedModel, resolve_model
from openft.errors import InvalidRequest
from pipelines.model_grading import GradingEngineSpec, GradingTimeout, PromptRequest, answer_on_ray
from serve_app.state import AppState
from storage.models import Account


def _resolve(state: AppState, account: Account, name: str) -> ResolvedModel | None:
    with state.db.session() as session:
        return resolve_model(session, account.id, name)


def model_checker(state: AppState, account: Account) -> Callable[[str, str], None]:
    def check(name: str, param: str) -> None:
        resolved = _resolve(state, account, name)
        if resolved is None:
            raise InvalidRequest(f"{param} does not name a model you can use: a base, or one of your ft: models or "
                                 "checkpoints.", code="model_not_found", param=param)
        if not resolved.servable:
            raise InvalidRequest(f"{param} names a model that cannot answer prompts here: "
                                 f"{resolved.reason or 'it is not servable.'}", code="model_not_available", param=param)

    return check


def model_call(state: AppState, account: Account) -> Callable[[Sequence[ModelRequest]], list[ModelAnswer]]:
    settings = state.settings

    def call(requests: Sequence[ModelRequest]) -> list[ModelAnswer]:
        answers: list[ModelAnswer | None] = [None] * len(requests)
        by_base: dict[str, list[tuple[int, ResolvedModel]]] = {}
        for i, request in enumerate(requests):
            resolved = _resolve(state, account, request.model)  # deleted since validation: answered, not raised
            if resolved is None or not resolved.servable:
                answers[i] = ModelAnswer(None, error="The grading model is no longer available.")
                continue
            by_base.setdefault(resolved.base_id, []).append((i, resolved))
        for base_id, members in by_base.items():
            names = sorted({m.name for _, m in members if m.adapter_prefix})
            alias = {name: f"g{k}" for k, name in enumerate(names)}
            prefixes = {m.name: m.adapter_prefix for _, m in members if m.adapter_prefix}
            spec = GradingEngineSpec(base_id, settings.batch_engine, settings.model_source, str(settings.model_cache_dir),
                                     tuple(state.store.spec()), tuple((alias[n], prefixes[n]) for n in names),
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
