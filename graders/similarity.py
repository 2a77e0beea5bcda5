"""text_similarity's metrics, each one call into the library that defines it, scaled to [0, 1]:

- fuzzy_match: rapidfuzz `fuzz.WRatio` with `utils.default_process` (lower case, alphanumerics),
  as OpenAI's graders guide grades fuzzy matches, / 100;
- bleu: sacrebleu's sentence BLEU (`BLEU(effective_order=True).sentence_score`, its 13a tokenizer
  and exponential smoothing, as `sacrebleu.sentence_bleu`), / 100;
- gleu: nltk `sentence_gleu`; meteor: nltk `meteor_score` with WordNet (both over whitespace tokens,
  the form of nltk's own examples);
- rouge_1 .. rouge_5, rouge_l: rouge-score's `RougeScorer` F-measure (its tokenizer, no stemmer).

The scorers are built once per process. WordNet (for meteor) is read where nltk looks for its data;
`make` builds it there at install from Debian's wordnet-base (graders/wordnet_data.py): nothing is
downloaded at run time, and a missing WordNet is a clear error, not a download.
"""

from __future__ import annotations

import functools
import warnings

METRICS = ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l")
_ROUGE = {"rouge_1": "rouge1", "rouge_2": "rouge2", "rouge_3": "rouge3", "rouge_4": "rouge4", "rouge_5": "rouge5",
          "rouge_l": "rougeL"}


class MetricUnavailable(RuntimeError):
    """A metric whose data is not installed here (meteor without WordNet)."""


def score(metric: str, text: str, reference: str) -> float:
    """The metric of `text` against `reference`, in [0, 1]."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz, utils

        return fuzz.WRatio(text, reference, processor=utils.default_process) / 100.0
    if metric == "bleu":
        return _bleu().sentence_score(text, [reference]).score / 100.0
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu([reference.split()], text.split()))
    if metric == "meteor":
        from nltk.translate.meteor_score import meteor_score

        return float(meteor_score([reference.split()], text.split(), wordnet=wordnet()))
    if metric in _ROUGE:
        kind = _ROUGE[metric]
        return float(_rouge(kind).score(reference, text)[kind].fmeasure)
    raise ValueError(f"unknown metric {metric!r}")


@functools.cache
def _bleu():
    from sacrebleu.metrics import BLEU

    return BLEU(effective_order=True)


@functools.cache
def _rouge(kind: str):
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer([kind], use_stemmer=False)  # one order per scorer: a scorer computes all it holds


@functools.cache
def wordnet():
    """nltk's WordNet reader, loaded once; MetricUnavailable when its data is not installed."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:
        raise MetricUnavailable(
            "meteor needs WordNet, which is not installed: install Debian's wordnet-base and run "
            "`python -m graders.wordnet_data` (make does both)."
        ) from None
    with warnings.catch_warnings():  # "multilingual functions are not available": meteor reads English only
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(root, None)


def available(metric: str) -> bool:
    if metric != "meteor":
        return metric in METRICS
    try:
        wordnet()
    except MetricUnavailable:
        return False
    return True
