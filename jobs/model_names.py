"""The one resolver of model names: a base id, an `ft:` model of the account, or one of its jobs'
checkpoints (`<ft name>:ckpt-step-<N>`, the name GET /v1/fine_tuning/jobs/{id}/checkpoints lists).

Where it sits: the Batch API (create-time scan, staging), the Models API (retrieve, adapter
downloads) and the checkpoints list call it; it reads storage/ and catalog/ only, never the object
store, so what it answers is the database's word. Who may use what:
- a base: anyone; `servable` is the catalog's;
- an `ft:` model: its account only, until it is deleted; a download-only base's model resolves
  with `servable: False` and the reason (so a batch can answer `model_not_available`);
- a checkpoint: its job's account only, while its adapter is kept. Kept means: one of the job's
  `CHECKPOINTS_KEPT` newest checkpoints (the trainer deletes older adapters, train/checkpoint.py),
  the job's run copies not reaped yet (7 days after it ends, serve_app/services/retention.py), and
  the job's `ft:` model not deleted (deleting it deletes its checkpoints' files too).
Anything else is None: an unknown name and another account's model answer alike (not found).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from catalog.bases import BASES
from openft.errors import InvalidRequest
from storage import keys
from storage.models import Account, FineTunedModel, Job, JobEvent

# The newest checkpoints whose adapters are kept while the job's run copies are (OpenAI keeps the
# last 3 epochs'). Optimizer state is kept for the newest only: a resume needs no other.
CHECKPOINTS_KEPT = 3
_CHECKPOINT = re.compile(r"(?P<model>ft:[^:]+:[0-9a-f]+:(?P<suffix>[0-9a-f]{12})):ckpt-step-(?P<step>[1-9][0-9]{0,11})")


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    base_id: str
    kind: str  # "base" | "ft" | "checkpoint"
    adapter_prefix: str | None  # store prefix (ends "/") of peft-format adapter_model.safetensors + adapter_config.json
    servable: bool
    reason: str | None


@dataclass(frozen=True)
class KeptCheckpoint:
    step: int
    event: JobEvent  # the trainer's "Checkpoint saved" event (data.checkpoint: step, epoch, train_loss)
    adapter_prefix: str


def resolve_model(session, account_id: str, name: str) -> ResolvedModel | None:
    """None: unknown, or another account's (answered as not found). Raises nothing for deleted: returns None."""
    base = BASES.get(name)
    if base is not None:
        return ResolvedModel(name, base.id, "base", None, base.servable, base.not_servable_reason)
    if not name.startswith("ft:"):
        return None
    row = live_model(session, account_id, name)
    if row is not None:
        return ResolvedModel(name, row.base, "ft", row.adapter_prefix.rstrip("/") + "/", row.servable, row.reason)
    found = resolve_checkpoint(session, account_id, name)
    if found is None:
        return None
    job, ckpt = found
    base = BASES[job.model]
    servable, reason = base.servable, base.not_servable_reason
    model = session.scalar(select(FineTunedModel).where(FineTunedModel.job_id == job.id))
    if servable and model is not None and not model.servable:
        servable, reason = False, model.reason  # a check at registration refused the job's adapter
    return ResolvedModel(name, base.id, "checkpoint", ckpt.adapter_prefix, servable, reason)


def model_checker(db, account_id: str) -> Callable[[str, str], None]:
    """(model name, param) -> None, or the refusal of a model a grader of the account cannot use
    (unknown, another account's, not servable): evals, the grader endpoints and reinforcement jobs."""

    def check(name: str, param: str) -> None:
        with db.session() as session:
            resolved = resolve_model(session, account_id, name)
        if resolved is None:
            raise InvalidRequest(f"{param} does not name a model you can use: a base, or one of your ft: models or "
                                 "checkpoints.", code="model_not_found", param=param)
        if not resolved.servable:
            raise InvalidRequest(f"{param} names a model that cannot answer prompts here: "
                                 f"{resolved.reason or 'it is not servable.'}", code="model_not_available", param=param)

    return check


def resolve_checkpoint(session, account_id: str, name: str) -> tuple[Job, KeptCheckpoint] | None:
    """The job and kept checkpoint a checkpoint name names, if the account may use it."""
    match = _CHECKPOINT.fullmatch(name)
    if match is None:
        return None
    job = session.scalar(select(Job).where(
        Job.account_id == account_id, Job.id.startswith("ftjob-" + match["suffix"], autoescape=True)))
    if job is None or job_model_name(session, job) != match["model"]:
        return None
    step = int(match["step"])
    return next(((job, c) for c in kept_checkpoints(session, job) if c.step == step), None)


def model_name(base_id: str, org_id: str, job_id: str) -> str:
    """`ft:<base>:<org>:<job suffix>`: the reference's form (jobs/registration.py registers it)."""
    return f"ft:{base_id}:{org_id.removeprefix('org-')}:{job_id.removeprefix('ftjob-')[:12]}"


def job_model_name(session, job: Job) -> str:
    """The `ft:` name of a job's adapter, also before it is registered (checkpoints carry it)."""
    named = (job.fine_tuned_adapter or {}).get("model")
    return named or model_name(job.model, session.get(Account, job.account_id).org_id, job.id)


def checkpoint_events(session, job_id: str) -> list[tuple[int, JobEvent]]:
    """Every checkpoint the trainer recorded, newest first, one per step (a step saved twice, by a
    run that restarted, counts once: its newest event)."""
    events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq.desc())).all()
    seen, found = set(), []
    for event in events:
        info = (event.data or {}).get("checkpoint")
        if isinstance(info, dict) and info.get("step") not in seen:  # a resume names its checkpoint as a string
            seen.add(info["step"])
            found.append((info["step"], event))
    return found


def kept_checkpoints(session, job: Job) -> list[KeptCheckpoint]:
    """The job's checkpoints whose adapters are kept (see the module docstring), newest first."""
    if job.copies_deleted_at is not None:
        return []
    deleted = session.scalar(select(FineTunedModel.id).where(
        FineTunedModel.job_id == job.id, FineTunedModel.deleted_at.is_not(None)))
    if deleted is not None:
        return []
    newest = sorted(checkpoint_events(session, job.id), key=lambda c: c[0], reverse=True)[:CHECKPOINTS_KEPT]
    return [KeptCheckpoint(step, event, keys.checkpoint(job.id, step)) for step, event in newest]


def live_model(session, account_id: str, name: str) -> FineTunedModel | None:
    """The account's `ft:` model of that name, unless it was deleted."""
    return session.scalar(select(FineTunedModel).where(
        FineTunedModel.id == name, FineTunedModel.account_id == account_id, FineTunedModel.deleted_at.is_(None)))


def live_models(session, account_id: str) -> list[FineTunedModel]:
    """The account's `ft:` models that are not deleted, oldest first."""
    return list(session.scalars(select(FineTunedModel).where(
        FineTunedModel.account_id == account_id, FineTunedModel.deleted_at.is_(None)).order_by(FineTunedModel.created_ns)))
