"""HTTP routes of the fine-tuning jobs resource (`/v1/fine_tuning/jobs`)."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account, heavy_request
from serve_app.request_body import json_object
from serve_app.schemas.common import Page
from serve_app.schemas.fine_tuning import FineTuningJob, FineTuningJobCheckpoint, FineTuningJobEvent
from serve_app.services import fine_tuning_jobs as service
from storage.models import Account

router = APIRouter(prefix="/fine_tuning/jobs", tags=["fine_tuning"])
_METADATA_KEY = re.compile(r"^metadata\[(.+)\]$")


@router.post("", response_model=FineTuningJob, dependencies=[Depends(heavy_request)])
async def create_fine_tuning_job(request: Request, account: Account = Depends(current_account)) -> FineTuningJob:
    body = await json_object(request)
    return await run_in_threadpool(service.create_job, request.app.state.openft, account, body)


@router.get("", response_model=Page[FineTuningJob])
def list_fine_tuning_jobs(
    request: Request, after: str | None = None, limit: int = Query(20), account: Account = Depends(current_account)
) -> Page[FineTuningJob]:
    metadata = {}
    for key, value in request.query_params.multi_items():
        match = _METADATA_KEY.match(key)
        if match:
            metadata[match.group(1)] = value
    return service.list_jobs(request.app.state.openft, account, limit=limit, after=after, metadata=metadata)


@router.get("/{fine_tuning_job_id}", response_model=FineTuningJob)
def retrieve_fine_tuning_job(fine_tuning_job_id: str, request: Request, account: Account = Depends(current_account)):
    return service.retrieve_job(request.app.state.openft, account, fine_tuning_job_id)


@router.get("/{fine_tuning_job_id}/events", response_model=Page[FineTuningJobEvent])
def list_fine_tuning_events(
    fine_tuning_job_id: str, request: Request, after: str | None = None, limit: int = Query(20),
    account: Account = Depends(current_account),
):
    return service.list_events(request.app.state.openft, account, fine_tuning_job_id, limit=limit, after=after)


@router.get("/{fine_tuning_job_id}/checkpoints", response_model=Page[FineTuningJobCheckpoint])
def list_fine_tuning_checkpoints(
    fine_tuning_job_id: str, request: Request, after: str | None = None, limit: int = Query(10),
    account: Account = Depends(current_account),
):
    return service.list_checkpoints(request.app.state.openft, account, fine_tuning_job_id, limit=limit, after=after)


@router.post("/{fine_tuning_job_id}/cancel", response_model=FineTuningJob)
def cancel_fine_tuning_job(fine_tuning_job_id: str, request: Request, account: Account = Depends(current_account)):
    return service.cancel_job(request.app.state.openft, account, fine_tuning_job_id)


@router.post("/{fine_tuning_job_id}/pause", response_model=FineTuningJob)
def pause_fine_tuning_job(fine_tuning_job_id: str, request: Request, account: Account = Depends(current_account)):
    return service.pause_job(request.app.state.openft, account, fine_tuning_job_id)


@router.post("/{fine_tuning_job_id}/resume", response_model=FineTuningJob)
def resume_fine_tuning_job(fine_tuning_job_id: str, request: Request, account: Account = Depends(current_account)):
    return service.resume_job(request.app.state.openft, account, fine_tuning_job_id)
