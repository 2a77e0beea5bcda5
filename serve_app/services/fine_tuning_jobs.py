"""Fine-tuning jobs as the API answers them: create (its checks and admission are jobs/create.py's),
list, retrieve, events, checkpoints, and cancel, pause and resume (jobs/transitions.py), each
returned as OpenAI's job object."""

from __future__ import annotations

from jobs import model_names, transitions
from jobs.create import create
from jobs.spec import JobSpec
from openft.errors import Conflict, NotFound
from serve_app.schemas.common import Page
from serve_app.schemas.fine_tuning import (
    CheckpointMetrics,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    JobError,
    JobGridline,
)
from serve_app.services.paging import check_limit
from serve_app.state import AppState
from storage import jobs as jobs_repo
from storage.leases import Moved
from storage.models import Account, Job


def job_object(job: Job, account: Account) -> FineTuningJob:
    spec = JobSpec.from_record(job.spec)
    return FineTuningJob(
        id=job.id,
        created_at=job.created_at,
        error=JobError(**job.error) if job.error else None,
        fine_tuned_model=job.fine_tuned_model,
        finished_at=job.finished_at,
        hyperparameters=spec.hyperparameters_wire(),
        model=job.model,
        organization_id=account.org_id,
        result_files=job.result_files or [],
        seed=job.seed,
        status=job.status,
        trained_tokens=job.trained_tokens,
        training_file=job.training_file,
        validation_file=job.validation_file,
        estimated_finish=job.estimated_finish,
        metadata=job.job_metadata,
        integrations=list(spec.integrations),
        method=spec.method_wire(),
        user_provided_suffix=job.user_provided_suffix,
        gridline=JobGridline(
            quote=job.quote, result=job.result, fine_tuned_adapter=job.fine_tuned_adapter, reason=job.reason,
            derived_from=spec.derived_from, charge=job.charge, parent=spec.parent,
        ),
    )


def create_job(state: AppState, account: Account, body: dict) -> FineTuningJob:
    """jobs/create.py checks and admits it; a batch results file as training_file (the distill
    shortcut) is distilled and checked later by the worker (jobs/distilling.py)."""
    return job_object(create(state, account, body), account)


def _get(session, account: Account, job_id: str, *, for_update: bool = False) -> Job:
    job = jobs_repo.get_job(session, account.id, job_id, for_update=for_update)
    if job is None:
        raise NotFound("No such fine-tuning job.", param="fine_tuning_job_id")
    return job


def retrieve_job(state: AppState, account: Account, job_id: str) -> FineTuningJob:
    with state.db.session() as session:
        return job_object(_get(session, account, job_id), account)


def list_jobs(state: AppState, account: Account, *, limit: int, after: str | None, metadata: dict[str, str]) -> Page[FineTuningJob]:
    check_limit(limit, 100)
    with state.db.session() as session:
        rows, has_more = jobs_repo.list_jobs(session, account.id, limit=limit, after=after, metadata=metadata)
        data = [job_object(j, account) for j in rows]
    return Page[FineTuningJob](data=data, has_more=has_more)


def list_events(state: AppState, account: Account, job_id: str, *, limit: int, after: str | None) -> Page[FineTuningJobEvent]:
    check_limit(limit, 100)
    with state.db.session() as session:
        _get(session, account, job_id)
        rows, has_more = jobs_repo.list_events(session, job_id, limit=limit, after=after)
        data = [
            FineTuningJobEvent(id=e.id, created_at=e.created_at, level=e.level, message=e.message, data=e.data, type=e.type)
            for e in rows
        ]
    return Page[FineTuningJobEvent](data=data, has_more=has_more)


def list_checkpoints(
    state: AppState, account: Account, job_id: str, *, limit: int, after: str | None
) -> Page[FineTuningJobCheckpoint]:
    """The job's kept checkpoints (jobs/model_names.py: the newest 3 until the run's copies are reaped),
    newest first; each `fine_tuned_model_checkpoint` is a model (GET /v1/models/{name}, batches)."""
    check_limit(limit, 100)
    with state.db.session() as session:
        job = _get(session, account, job_id)
        name = model_names.job_model_name(session, job)
        kept = model_names.kept_checkpoints(session, job)
    checkpoints = []
    for ckpt in kept:
        info = ckpt.event.data["checkpoint"]
        checkpoints.append(FineTuningJobCheckpoint(
            id="ftckpt_" + ckpt.event.id.removeprefix("ftevent-"), created_at=ckpt.event.created_at,
            fine_tuned_model_checkpoint=f"{name}:ckpt-step-{ckpt.step}", fine_tuning_job_id=job_id,
            metrics=CheckpointMetrics(step=ckpt.step, train_loss=info.get("train_loss"),
                                      valid_mean_reward=info.get("valid_reward")), step_number=ckpt.step,
        ))
    if after:
        ids = [c.id for c in checkpoints]
        checkpoints = checkpoints[ids.index(after) + 1:] if after in ids else checkpoints
    page = checkpoints[:limit]
    return Page[FineTuningJobCheckpoint](
        data=page, has_more=len(checkpoints) > limit,
        first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
    )


def _invalid_state(action: str, moved: Moved) -> Conflict:
    return Conflict(f"This job cannot be {action}: it is {moved.why}.", code="invalid_state", param="fine_tuning_job_id")


def _transition(state: AppState, account: Account, job_id: str, action: str, move) -> FineTuningJob:
    """Run one of the job's transitions (jobs/transitions.py) on the caller's job; 409 when it refuses."""
    now = state.now()
    with state.db.session() as session:
        job = transitions.lock_job(session, job_id, account.id)
        if job is None:
            raise NotFound("No such fine-tuning job.", param="fine_tuning_job_id")
        moved = move(session, job, now)
        if not moved.ok:
            raise _invalid_state(action, moved)
        return job_object(job, account)


def cancel_job(state: AppState, account: Account, job_id: str) -> FineTuningJob:
    return _transition(state, account, job_id, "cancelled", transitions.cancel)


def pause_job(state: AppState, account: Account, job_id: str) -> FineTuningJob:
    return _transition(state, account, job_id, "paused", transitions.pause)


def resume_job(state: AppState, account: Account, job_id: str) -> FineTuningJob:
    return _transition(state, account, job_id, "resumed", transitions.resume)
