"""Two runs of one eval side by side (an ft: model and its base, or two checkpoints): per
criterion the pass rate and the mean score of each, each run's token usage, and the items whose
grade changed, matched by their index in the source. Pure: the service reads the rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Graded:
    """One recorded output item, as the comparison reads it."""

    index: int
    status: str  # pass | fail | error
    results: dict[str, tuple[float, bool]]  # criterion name -> (score, passed)


def criteria(names: Sequence[str], items: Sequence[Graded]) -> list[dict]:
    """Per criterion: pass rate and mean score over the items that have a sample (None: none has)."""
    out = []
    for name in names:
        grades = [item.results[name] for item in items if item.status != "error" and name in item.results]
        n = len(grades)
        out.append({"name": name, "graded": n, "pass_rate": sum(p for _, p in grades) / n if n else None,
                    "mean_score": sum(s for s, _ in grades) / n if n else None})
    return out


def changed(before: Sequence[Graded], after: Sequence[Graded]) -> list[dict]:
    """The items both runs recorded whose status or any criterion's pass changed, in item order."""
    first = {item.index: item for item in before}
    out = []
    for item in sorted(after, key=lambda i: i.index):
        old = first.get(item.index)
        if old is None:
            continue
        moved = {name: {"before": {"score": old.results[name][0], "passed": old.results[name][1]},
                        "after": {"score": score, "passed": passed}}
                 for name, (score, passed) in item.results.items()
                 if name in old.results and old.results[name][1] != passed}
        if moved or old.status != item.status:
            out.append({"datasource_item_id": item.index, "before": old.status, "after": item.status,
                        "criteria": moved})
    return out
