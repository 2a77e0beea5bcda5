"""HTTP routes of the grader endpoints (`/v1/fine_tuning/alpha/graders/{validate,run}`)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account
from serve_app.request_body import json_object
from serve_app.schemas.graders import GraderRunResponse, GraderValidateResponse
from serve_app.services import graders as service
from storage.models import Account

router = APIRouter(prefix="/fine_tuning/alpha/graders", tags=["graders"])


@router.post("/validate", response_model=GraderValidateResponse)
async def validate_grader(request: Request, account: Account = Depends(current_account)) -> GraderValidateResponse:
    body = await json_object(request)
    return await run_in_threadpool(service.validate_grader, request.app.state.openft, account, body)


@router.post("/run", response_model=GraderRunResponse)
async def run_grader(request: Request, account: Account = Depends(current_account)) -> GraderRunResponse:
    body = await json_object(request)
    started = time.monotonic()
    # A python grader's sandbox and a model grader's generation block: off the event loop.
    response = await run_in_threadpool(service.run_grader, request.app.state.openft, account, body)
    response.metadata.execution_time = round(time.monotonic() - started, 3)
    return response
