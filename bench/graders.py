"""Benchmark of graders/: grades per second through `grade_many`, against a plain in-process loop
over the same metric library on the same pairs, in one process and run.

  string_check      grader vs `text == reference` (templates rendered by hand)
  <metric>          text_similarity grader vs one direct call of the metric's library per pair
                    (rapidfuzz WRatio, sacrebleu sentence BLEU, nltk gleu/meteor, rouge-score)
  python            the python grader in its sandbox (a process per grade: bwrap, setpriv, prlimit,
                    a fresh interpreter) vs the same grade() function called in-process

Each figure is the best of three timed passes after one warm-up pass (which loads WordNet and
the scorers once). The ratio is baseline time / grader time: 1.0 means no overhead. The last line
printed is one JSON object.

    python bench/graders.py [--pairs 400] [--python-pairs 20] [--seed 3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graders import grade_many, sample_namespace, validate  # noqa: E402
from graders.grade import Runtime  # noqa: E402
from graders.sandbox import SandboxLimits  # noqa: E402

WORDS = ("the cat sat on a mat while a dog ran past the old red barn under grey skies and quiet trees near the river "
         "bank where children played with kites and boats").split()
PY_SOURCE = "def grade(sample, item):\n    return float(sample['output_text'] == item['reference'])\n"


def _pairs(n: int, seed: int) -> list[tuple[dict, dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ref = rng.choices(WORDS, k=rng.randint(8, 24))
        hyp = [w if rng.random() < 0.7 else rng.choice(WORDS) for w in ref]
        out.append((sample_namespace(" ".join(hyp)), {"reference": " ".join(ref)}))
    return out


def _best(fn, repeats: int = 3) -> float:
    fn()  # warm-up: WordNet, scorers, imports
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def _baseline(metric: str):
    """The metric's library called directly, as a plain loop would (scorers built once, outside)."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz, utils

        return lambda t, r: fuzz.WRatio(t, r, processor=utils.default_process) / 100
    if metric == "bleu":
        from sacrebleu.metrics import BLEU

        bleu = BLEU(effective_order=True)
        return lambda t, r: bleu.sentence_score(t, [r]).score / 100
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return lambda t, r: sentence_gleu([r.split()], t.split())
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        from graders.similarity import wordnet

        wn = wordnet()
        return lambda t, r: meteor_score([r.split()], t.split(), wordnet=wn)
    from rouge_score.rouge_scorer import RougeScorer

    kind = {"rouge_l": "rougeL"}.get(metric, metric.replace("_", ""))
    scorer = RougeScorer([kind])
    return lambda t, r: scorer.score(r, t)[kind].fmeasure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--python-pairs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    pairs = _pairs(args.pairs, args.seed)
    figures: dict[str, dict] = {}

    def record(name: str, grader_s: float, base_s: float, n: int) -> None:
        figures[name] = {"grades_per_s": round(n / grader_s, 1), "baseline_per_s": round(n / base_s, 1),
                         "ratio": round(base_s / grader_s, 3)}
        print(f"{name:>13}: {n / grader_s:10.1f} grades/s  baseline {n / base_s:10.1f}/s  ratio {base_s / grader_s:.3f}",
              file=sys.stderr)

    check = validate({"type": "string_check", "name": "c", "input": "{{sample.output_text}}",
                      "reference": "{{item.reference}}", "operation": "eq"})
    record("string_check", _best(lambda: grade_many(check, pairs)),
           _best(lambda: [s["output_text"] == i["reference"] for s, i in pairs]), len(pairs))
    for metric in ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5",
                   "rouge_l"):
        grader = validate({"type": "text_similarity", "name": metric, "input": "{{sample.output_text}}",
                           "reference": "{{item.reference}}", "evaluation_metric": metric, "pass_threshold": 0.5})
        direct = _baseline(metric)
        ours = grade_many(grader, pairs)
        assert all(abs(g.score - direct(s["output_text"], i["reference"])) < 1e-9 for g, (s, i) in zip(ours, pairs))
        record(metric, _best(lambda: grade_many(grader, pairs)),
               _best(lambda: [direct(s["output_text"], i["reference"]) for s, i in pairs]), len(pairs))

    few = pairs[: args.python_pairs]
    python = validate({"type": "python", "name": "p", "source": PY_SOURCE})
    runtime = Runtime(sandbox=SandboxLimits(wall_seconds=60, cpu_seconds=30))
    scope: dict = {}
    exec(compile(PY_SOURCE, "grader.py", "exec"), scope)  # the baseline: the same function, in-process
    grades = grade_many(python, few, runtime)
    assert all(g.reason is None for g in grades), [g.reason for g in grades if g.reason]
    record("python", _best(lambda: grade_many(python, few, runtime), repeats=1),
           _best(lambda: [scope["grade"](s, i) for s, i in few]), len(few))
    print(json.dumps({"pairs": args.pairs, "python_pairs": len(few), **figures}))


if __name__ == "__main__":
    main()
