"""HTTP routes of the evals resource (`/v1/evals`), its runs and their output items."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account
from serve_app.request_body import json_object
from serve_app.schemas.common import Page
from serve_app.schemas.eval_runs import EvalRun, EvalRunDeleted, OutputItem
from serve_app.schemas.evals import Eval, EvalDeleted
from serve_app.services import eval_runs as runs
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


# -- runs (serve_app/services/eval_runs.py) ---------------------------------------------------------
@router.post("/{eval_id}/runs", response_model=EvalRun)
async def create_eval_run(eval_id: str, request: Request, account: Account = Depends(current_account)) -> EvalRun:
    body = await json_object(request)
    # Reads the source file and the models, and writes the items to the store: off the loop.
    return await run_in_threadpool(runs.create_run, request.app.state.openft, account, eval_id, body)


@router.get("/{eval_id}/runs", response_model=Page[EvalRun])
def list_eval_runs(eval_id: str, request: Request, after: str | None = None, limit: int = Query(20),
                   order: str = "asc", status: str | None = None,
                   account: Account = Depends(current_account)) -> Page[EvalRun]:
    return runs.list_runs(request.app.state.openft, account, eval_id, limit=limit, after=after, order=order,
                          status=status)


@router.get("/{eval_id}/runs/{run_id}", response_model=EvalRun)
def retrieve_eval_run(eval_id: str, run_id: str, request: Request,
                      account: Account = Depends(current_account)) -> EvalRun:
    return runs.retrieve_run(request.app.state.openft, account, eval_id, run_id)


@router.post("/{eval_id}/runs/{run_id}/cancel", response_model=EvalRun)
def cancel_eval_run(eval_id: str, run_id: str, request: Request, account: Account = Depends(current_account)) -> EvalRun:
    return runs.cancel_run(request.app.state.openft, account, eval_id, run_id)


@router.delete("/{eval_id}/runs/{run_id}", response_model=EvalRunDeleted)
def delete_eval_run(eval_id: str, run_id: str, request: Request,
                    account: Account = Depends(current_account)) -> EvalRunDeleted:
    return runs.delete_run(request.app.state.openft, account, eval_id, run_id)


@router.get("/{eval_id}/runs/{run_id}/output_items", response_model=Page[OutputItem])
def list_eval_run_output_items(eval_id: str, run_id: str, request: Request, after: str | None = None,
                               limit: int = Query(20), order: str = "asc", status: str | None = None,
                               account: Account = Depends(current_account)) -> Page[OutputItem]:
    return runs.list_items(request.app.state.openft, account, eval_id, run_id, limit=limit, after=after, order=order,
                           status=status)


@router.get("/{eval_id}/runs/{run_id}/output_items/{output_item_id}", response_model=OutputItem)
def retrieve_eval_run_output_item(eval_id: str, run_id: str, output_item_id: str, request: Request,
                                  account: Account = Depends(current_account)) -> OutputItem:
    return runs.retrieve_item(request.app.state.openft, account, eval_id, run_id, output_item_id)
