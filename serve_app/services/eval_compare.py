"""Two runs of one eval compared (`GET /v1/gridline/evals/{eval_id}/compare`): the rules are
evals/compare.py's; this reads the caller's runs and items (another account's answer 404)."""

from __future__ import annotations

from evals import compare
from openft.errors import InvalidRequest
from serve_app.schemas.eval_runs import ComparedRun, EvalRunComparison
from serve_app.services.eval_runs import get_eval, get_run
from serve_app.state import AppState
from storage import evals as repo
from storage.models import Account


def _graded(rows) -> list[compare.Graded]:
    return [compare.Graded(r.item_index, r.status, {x["name"]: (x["score"], x["passed"]) for x in r.results})
            for r in rows]


def compare_runs(state: AppState, account: Account, eval_id: str, run_id: str | None,
                 other_run_id: str | None) -> EvalRunComparison:
    with state.db.session() as session:
        get_eval(session, account, eval_id)  # another account's eval: 404 before anything else is said
    for name, value in (("run_id", run_id), ("other_run_id", other_run_id)):
        if not value:
            raise InvalidRequest(f"Missing {name}: compare names two runs of the eval.",
                                 code="missing_required_parameter", param=name)
    if run_id == other_run_id:
        raise InvalidRequest("other_run_id names the same run as run_id; compare two runs.", code="invalid_value",
                             param="other_run_id")
    with state.db.session() as session:
        runs = [get_run(session, account, eval_id, run_id), get_run(session, account, eval_id, other_run_id)]
        items = [repo.all_items(session, r.id) for r in runs]
        graded = [_graded(rows) for rows in items]
        names = [c["name"] for c in runs[0].criteria]
        shown = [ComparedRun(id=r.id, model=r.model, status=r.status, result_counts=r.result_counts,
                             criteria=compare.criteria(names, g), per_model_usage=r.per_model_usage)
                 for r, g in zip(runs, graded)]
        source = {row.item_index: row.item for row in items[1]}
        changed = [{**c, "datasource_item": source[c["datasource_item_id"]]} for c in compare.changed(*graded)]
        return EvalRunComparison(eval_id=eval_id, runs=shown, changed=changed)
