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
from pipelines.model_grading import GradingMember, GradingSetup, answer_by_base
from storage.db import Database


def _resolve(db: Database, account_id: str, name: str) -> ResolvedModel | None:
    with db.session() as session:
        return resolve_model(session, account_id, name)


def model_call(db: Database, store_spec: tuple, settings: Settings,
               account_id: str) -> Callable[[Sequence[ModelRequest]], list[ModelAnswer]]:
    def call(requests: Sequence[ModelRequest]) -> list[ModelAnswer]:
        answers: list[ModelAnswer | None] = [None] * len(requests)
        members = []
        for i, request in enumerate(requests):
            resolved = _resolve(db, account_id, request.model)  # deleted since validation: answered, not raised
            if resolved is None or not resolved.servable:
                answers[i] = ModelAnswer(None, error="The grading model is no longer available.")
                continue
            members.append(GradingMember(i, resolved.base_id, resolved.name, resolved.adapter_prefix, request))
        for i, answer in answer_by_base(GradingSetup.of(settings, store_spec), members, "grader model").items():
            answers[i] = answer
        return answers  # type: ignore[return-value]

    return call


def runtime(db: Database, store_spec: tuple, settings: Settings, account_id: str) -> Runtime:
    return Runtime(model_call=model_call(db, store_spec, settings, account_id), sandbox=SandboxLimits.of(settings))
