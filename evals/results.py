"""A run's grades as OpenAI shows them: each item's `results` (one per criterion, with its reason)
and status, and the run's `result_counts`, `per_testing_criteria_results` and `per_model_usage`,
counted from the recorded items (so a run driven twice, or canceled, counts what it kept). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from graders import Grade, Grader


def result(grader: Grader, grade: Grade) -> dict:
    """One criterion's grade of one item (OpenAI's output item `results[]`, with our reason and usage)."""
    details = grade.details
    out = {"name": grader.name, "type": grader.type, "score": grade.score, "passed": grade.passed, "sample": None,
           "reason": grade.reason}
    for key in ("label", "sub_scores", "usage", "errors"):
        if details.get(key):
            out[key] = details[key]
    return out


def item_status(results: list[dict], errored: bool) -> str:
    if errored:
        return "error"
    return "pass" if results and all(r["passed"] for r in results) else "fail"


def counts(statuses: Sequence[str]) -> dict:
    return {"total": len(statuses), "passed": statuses.count("pass"), "failed": statuses.count("fail"),
            "errored": statuses.count("error")}


def per_criteria(names: Sequence[str], items: Sequence[tuple[str, list[dict]]]) -> list[dict]:
    """Passed and failed per criterion over the items that have a sample (an errored one has no grade)."""
    out = []
    for name in names:
        grades = [r["passed"] for status, results in items if status != "error" for r in results if r["name"] == name]
        out.append({"testing_criteria": name, "passed": sum(grades), "failed": len(grades) - sum(grades)})
    return out


def usage(sampled: str, items: Sequence[tuple[dict, list[dict]]]) -> list[dict]:
    """Per model: the sampled model's requests and tokens (from each item's sample), then every
    grading model's (from each grade's usage)."""
    by_model: dict[str, list[int]] = {}

    def add(model: str, prompt: int, completion: int) -> None:
        counts_ = by_model.setdefault(model, [0, 0, 0])
        counts_[0] += 1
        counts_[1] += prompt
        counts_[2] += completion

    for sample, results in items:
        if sampled and sample.get("output"):
            add(sampled, sample["usage"]["prompt_tokens"], sample["usage"]["completion_tokens"])
        for r in results:
            for model, tokens in (r.get("usage") or {}).items():
                add(model, tokens["prompt_tokens"], tokens["completion_tokens"])
    return [{"model_name": model, "invocation_count": n, "prompt_tokens": p, "completion_tokens": c,
             "total_tokens": p + c, "cached_tokens": 0} for model, (n, p, c) in by_model.items()]


def billed_tokens(per_model_usage: list[dict]) -> int:
    return sum(u["total_tokens"] for u in per_model_usage)
