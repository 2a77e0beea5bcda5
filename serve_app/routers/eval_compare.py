"""HTTP route comparing two runs of an eval (`/v1/gridline/evals/{eval_id}/compare`): an SDK user
reads it with `client.get("/gridline/evals/<id>/compare", cast_to=object, options={"params": ...})`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from serve_app.auth import current_account
from serve_app.schemas.eval_runs import EvalRunComparison
from serve_app.services.eval_compare import compare_runs
from storage.models import Account

router = APIRouter(prefix="/gridline/evals", tags=["evals"])


@router.get("/{eval_id}/compare", response_model=EvalRunComparison)
def compare_eval_runs(eval_id: str, request: Request, run_id: str | None = None, other_run_id: str | None = None,
                      account: Account = Depends(current_account)) -> EvalRunComparison:
    return compare_runs(request.app.state.openft, account, eval_id, run_id, other_run_id)
