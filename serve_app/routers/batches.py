"""HTTP routes of the batches resource (`/v1/batches`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account, heavy_request
from serve_app.request_body import json_object
from serve_app.schemas.batches import Batch
from serve_app.schemas.common import Page
from serve_app.services import batches as service
from storage.models import Account

router = APIRouter(prefix="/batches", tags=["batches"])


@router.post("", response_model=Batch, dependencies=[Depends(heavy_request)])
async def create_batch(request: Request, account: Account = Depends(current_account)) -> Batch:
    body = await json_object(request)
    # The scan reads the whole input file: off the event loop.
    return await run_in_threadpool(service.create_batch, request.app.state.openft, account, body)


@router.get("", response_model=Page[Batch])
def list_batches(request: Request, after: str | None = None, limit: int = Query(20),
                 account: Account = Depends(current_account)) -> Page[Batch]:
    return service.list_batches(request.app.state.openft, account, limit=limit, after=after)


@router.get("/{batch_id}", response_model=Batch)
def retrieve_batch(batch_id: str, request: Request, account: Account = Depends(current_account)) -> Batch:
    return service.retrieve_batch(request.app.state.openft, account, batch_id)


@router.post("/{batch_id}/cancel", response_model=Batch)
def cancel_batch(batch_id: str, request: Request, account: Account = Depends(current_account)) -> Batch:
    return service.cancel_batch(request.app.state.openft, account, batch_id)
