"""Every text_similarity metric against its library's own published examples, through the
grader (text in, score in [0, 1] out): rapidfuzz's README, sacrebleu's test_sentence_bleu.py,
nltk's gleu_score and meteor_score docstrings, rouge-score's rouge_scorer_test.py."""

from __future__ import annotations

import pytest

from graders import grade, sample_namespace, validate

# nltk's docstring examples (gleu_score.sentence_gleu, meteor_score.meteor_score), joined into text.
HYP1 = "It is a guide to action which ensures that the military always obeys the commands of the party"
HYP2 = "It is to insure the troops forever hearing the activity guidebook that party direct"
REF1 = "It is a guide to action that ensures that the military will forever heed Party commands"

EXAMPLES = [
    # rapidfuzz README, "Weighted Ratio" (with utils.default_process), / 100
    ("fuzzy_match", "this is a test", "this is a new test!!!", 0.95),
    ("fuzzy_match", "this is a word", "THIS IS A WORD", 1.0),
    # sacrebleu test/test_sentence_bleu.py: exp smoothing, 13a, effective order: 8.493; zero case 0.0
    ("bleu", "Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;",
     "producţia de zahăr brut se exprimă în zahăr alb;", 0.08493),
    ("bleu", "this is a cat", "okay thanks", 0.0),
    # nltk gleu_score.sentence_gleu docstring: 0.4393..., 0.1206..., 0.0909...
    ("gleu", HYP1, REF1, 0.4393),
    ("gleu", HYP2, REF1, 0.1206),
    ("gleu", "the the the the the the the", "the cat is on the mat", 0.0909),
    # nltk meteor_score docstring: 0.6944 (WordNet synonyms), 0.0
    ("meteor", HYP1, REF1, 0.6944),
    ("meteor", "non matching hypothesis", "this is a cat", 0.0),
    # rouge-score rouge_scorer_test.py (target, prediction) -> fmeasure
    ("rouge_1", "testing", "testing one two", 1 / 2),
    ("rouge_2", "testing one", "testing one two", 2 / 3),
    ("rouge_l", "testing one", "testing one two", 4 / 5),
    ("rouge_l", "testing two", "testing one two", 4 / 5),
    ("rouge_3", "testing one two", "testing one two", 1.0),
    ("rouge_4", "a b c d e", "a b c d f", 2 * (1 / 2 * 1 / 2) / (1 / 2 + 1 / 2)),
    ("rouge_5", "a b c d e f", "a b c d e f", 1.0),
]


def _criterion(metric: str, threshold: float = 0.5) -> dict:
    return {"type": "text_similarity", "name": metric, "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}", "evaluation_metric": metric, "pass_threshold": threshold}


@pytest.mark.parametrize(("metric", "text", "reference", "expected"), EXAMPLES)
def test_metric_gives_the_library_reference_value(metric, text, reference, expected):
    result = grade(validate(_criterion(metric)), sample_namespace(text), {"reference": reference})
    assert result.score == pytest.approx(expected, abs=1e-4)
    assert result.passed is (result.score >= 0.5)
    assert result.reason is None


def test_the_rouge_metrics_are_the_library_scores_of_each_order():
    # rouge_scorer_test.testRouge1AgainstRouge155's pattern on our own pair: each order from one scorer call
    from rouge_score.rouge_scorer import RougeScorer

    target, prediction = "the quick brown fox jumps over the lazy dog", "the quick brown dog jumps on the log"
    scores = RougeScorer(["rouge1", "rouge2", "rouge3", "rouge4", "rouge5", "rougeL"]).score(target, prediction)
    for n in (1, 2, 3, 4, 5):
        got = grade(validate(_criterion(f"rouge_{n}")), sample_namespace(prediction), {"reference": target}).score
        assert got == pytest.approx(scores[f"rouge{n}"].fmeasure)
    got = grade(validate(_criterion("rouge_l")), sample_namespace(prediction), {"reference": target}).score
    assert got == pytest.approx(scores["rougeL"].fmeasure)
    assert scores["rouge1"].fmeasure > scores["rouge2"].fmeasure > scores["rouge3"].fmeasure


def test_pass_threshold_decides_passed():
    sample, item = sample_namespace("testing"), {"reference": "testing one two"}
    assert grade(validate(_criterion("rouge_1", 0.5)), sample, item).passed is True
    assert grade(validate(_criterion("rouge_1", 0.51)), sample, item).passed is False
