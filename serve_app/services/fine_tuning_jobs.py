"""Fine-tuning jobs: create (every refusal, the quote, admission under the open-job limit),
list, retrieve, events, cancel, pause and resume."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import select

from catalog.bases import get_base
from jobs import limits, transitions
from jobs.spec import JobSpec
from openft.errors import Conflict, NotFound
from openft.ids import job_id as new_job_id
from pipelines.create_checks import check_file_for_base
from serve_app.schemas.common import Page
from serve_app.schemas.fine_tuning import (
    CheckpointMetrics,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    JobError,
    JobGridline,
)
from serve_app.services.distill import distill_shortcut
from serve_app.services.job_params import FileFacts, check_job_files, file_not_found, parse_create_request
from serve_app.services.paging import check_limit
from serve_app.services.quote import quote_job
from serve_app.state import AppState
from storage import files as files_repo
from storage import jobs as jobs_repo
from storage.models import Account, File, Job
from train.registration import model_name

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
        method=spec.method_wire(),
        user_provided_suffix=job.user_provided_suffix,
        gridline=JobGridline(
            quote=job.quote, result=job.result, fine_tuned_adapter=job.fine_tuned_adapter, reason=job.reason,
            derived_from=spec.derived_from, charge=job.charge,
        ),
    )


def _facts(row: File) -> FileFacts:
    stats = row.stats or {}
    return FileFacts(
        id=row.id, purpose=row.purpose, status=row.status, bytes=row.bytes, row_kind=stats.get("row_kind"),
        rows=stats.get("rows", 0), messages=stats.get("messages", 0), content_bytes=stats.get("content_bytes", 0),
        token_upper_bound=stats.get("token_upper_bound", 0), token_estimates=stats.get("token_estimates", {}),
    )


def _files(state: AppState, account: Account, spec: JobSpec) -> tuple[File, File | None]:
    with state.db.session() as session:
        training = files_repo.get_file(session, account.id, spec.training_file)
        validation = files_repo.get_file(session, account.id, spec.validation_file) if spec.validation_file else None
    if training is None:
        raise file_not_found("training_file")
    if spec.validation_file and validation is None:
        raise file_not_found("validation_file")
    return training, validation


def create_job(state: AppState, account: Account, body: dict) -> FineTuningJob:
    spec = parse_create_request(body, seed_factory=lambda: secrets.randbelow(2**31))
    base = get_base(spec.model)
    with state.db.session() as session:
        limits.check_open_jobs(session, account)  # fail fast; checked again under the lock below
    body, derived = distill_shortcut(state, account, body)
    if derived:
        seed = spec.seed
        spec = parse_create_request(body, seed_factory=lambda: seed)
    training, validation = _files(state, account, spec)
    check_job_files(spec, _facts(training), _facts(validation) if validation else None)
    quote = quote_job(spec, _facts(training), _facts(validation) if validation else None, state.settings.prices,
                      time_limit_s=state.settings.job_time_limit_seconds)
    for param, row in (("training_file", training), ("validation_file", validation)):
        if row is not None:
            check_file_for_base(
                state.store.spec(), row.object_key, row_kind=row.stats["row_kind"], base=base,
                model_source=state.settings.model_source, cache_root=state.settings.model_cache_dir, param=param,
                inline_bytes=state.settings.validate_ray_threshold_bytes, block_bytes=state.settings.validate_block_bytes,
            )
    now = state.now()
    with state.db.session() as session:
        # The account row lock serializes concurrent creates of one account (SQLite: BEGIN IMMEDIATE).
        locked = session.scalar(select(Account).where(Account.id == account.id).with_for_update())
        limits.check_create(session, locked, state.settings, quote.per_token.max_charge_usd, now)
        for param, row in (("training_file", training), ("validation_file", validation)):
            if row is not None and files_repo.get_file(session, account.id, row.id) is None:
                raise file_not_found(param)  # deleted while the checks ran
        job = Job(
            id=new_job_id(), account_id=account.id, model=spec.model,
            created_at=now, created_ns=time.time_ns(), training_file=spec.training_file,
            validation_file=spec.validation_file, seed=spec.seed,
            spec=(spec.with_derived(derived) if derived else spec).record(),
            job_metadata=spec.metadata or None, user_provided_suffix=spec.suffix, quote=quote.model_dump(),
            estimated_finish=quote.estimated_finish(now), result_files=[], updated_at=now,
        )
        transitions.add_new(session, job, now)
        if derived:
            jobs_repo.add_event(
                session, job.id, now, f"Distilled {derived['results_file']} with its requests "
                f"{derived['requests_file']} into {derived['training_file']} (training) and "
                f"{derived['validation_file']} (validation).", data={"derived_from": derived},
            )
        if "suffix_ignored" in spec.warnings:
            jobs_repo.add_event(
                session, job.id, now, "suffix_ignored: suffix is accepted but not used for model names yet.",
                level="warn", data={"code": "suffix_ignored"},
            )
        transitions.admit(session, job, now)
        return job_object(job, account)


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
    """Checkpoints as the training loop recorded them (an event with `data.checkpoint`), newest first."""
    check_limit(limit, 100)
    with state.db.session() as session:
        job = _get(session, account, job_id)
        events, _ = jobs_repo.list_events(session, job_id, limit=100_000, after=None)
        name = (job.fine_tuned_adapter or {}).get("model") or model_name(job.model, account.org_id, job.id)
    checkpoints = []
    for event in events:
        info = (event.data or {}).get("checkpoint")
        if not info:
            continue
        checkpoints.append(FineTuningJobCheckpoint(
            id="ftckpt_" + event.id.removeprefix("ftevent-"), created_at=event.created_at,
            fine_tuned_model_checkpoint=f"{name}:ckpt-step-{info['step']}", fine_tuning_job_id=job_id,
            metrics=CheckpointMetrics(step=info["step"], train_loss=info.get("train_loss")), step_number=info["step"],
        ))
    if after:
        ids = [c.id for c in checkpoints]
        checkpoints = checkpoints[ids.index(after) + 1:] if after in ids else checkpoints
    page = checkpoints[:limit]
    return Page[FineTuningJobCheckpoint](
        data=page, has_more=len(checkpoints) > limit,
        first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
    )


def _invalid_state(action: str, moved: transitions.Moved) -> Conflict:
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
