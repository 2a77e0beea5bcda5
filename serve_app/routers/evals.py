"""HTTP routes of the evals resource (`/v1/evals`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account
from serve_app.request_body import json_object
from serve_app.schemas.common import Page
from serve_app.schemas.evals import Eval, EvalDeleted
from serve_app.services import evals as service
from storage.models import Account

router = APIRouter(prefix="/evals", tags=["evals"])


@router.post("", response_model=Eval)
async def create_eval(request: Request, account: Account = Depends(current_account)) -> Eval:
    body = await json_object(request)
    # Validating a python criterion parses its source, a model criterion reads the models: off the loop.
    return await run_in_threadpool(service.create_eval, request.app.state.openft, account, body)


@router.get("", response_model=Page[Eval])
def list_evals(request: Request, after: str | None = None, limit: int = Query(20), order: str = "asc",
               order_by: str = "created_at", account: Account = Depends(current_account)) -> Page[Eval]:
    return service.list_evals(request.app.state.openft, account, limit=limit, after=after, order=order,
                              order_by=order_by)


@router.get("/{eval_id}", response_model=Eval)
def retrieve_eval(eval_id: str, request: Request, account: Account = Depends(current_account)) -> Eval:
    return service.retrieve_eval(request.app.state.openft, account, eval_id)


@router.post("/{eval_id}", response_model=Eval)
async def update_eval(eval_id: str, request: Request, account: Account = Depends(current_account)) -> Eval:
    body = await json_object(request)
    return await run_in_threadpool(service.update_eval, request.app.state.openft, account, eval_id, body)


@router.delete("/{eval_id}", response_model=EvalDeleted)
def delete_eval(eval_id: str, request: Request, account: Account = Depends(current_account)) -> EvalDeleted:
    return service.delete_eval(request.app.state.openft, account, eval_id)
