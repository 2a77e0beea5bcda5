"""The built-in text the stand-in tokenizers are trained on.

Stand-in bases (catalog/standins.py) need a byte-level BPE vocabulary that splits English,
chat-template markup and support-ticket text into realistic multi-byte tokens, without any
download. This module generates that corpus deterministically from word lists shipped here:
template sentences over a small English lexicon, support tickets with their labels, and the
fixed strings the families' chat templates write (role names, default system prompts, dates).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_SUBJECTS = (
    "the customer", "my order", "the parcel", "our team", "the invoice", "this account", "the app",
    "the driver", "a refund", "the package", "your service", "the payment", "the website", "my card",
    "the manager", "the delivery", "the report", "the system", "a new user", "the support agent",
)
_VERBS = (
    "arrived", "failed", "was charged", "never came", "stopped working", "was cancelled", "is missing",
    "needs an update", "was returned", "did not load", "was approved", "keeps crashing", "was delayed",
    "looks wrong", "was sent twice", "cannot be opened", "was lost", "is broken", "was refunded",
)
_TAILS = (
    "yesterday", "last week", "this morning", "after the update", "again", "for the second time",
    "without any notice", "before the weekend", "on Monday", "at checkout", "in the mobile app",
    "when I tried to log in", "during the night", "since March", "two days ago", "today",
)
_WORDS = (
    "a", "about", "after", "again", "all", "also", "an", "and", "any", "are", "as", "at", "be", "because",
    "been", "before", "but", "by", "can", "could", "did", "do", "does", "for", "from", "had", "has",
    "have", "help", "how", "I", "if", "in", "into", "is", "it", "just", "know", "like", "make", "me",
    "more", "my", "need", "new", "no", "not", "now", "of", "on", "one", "only", "or", "other", "our",
    "out", "over", "please", "said", "see", "she", "should", "so", "some", "than", "thank", "that",
    "the", "their", "them", "then", "there", "they", "this", "time", "to", "two", "up", "us", "use",
    "very", "want", "was", "we", "what", "when", "which", "who", "will", "with", "would", "you", "your",
    "answer", "question", "problem", "solution", "number", "example", "text", "model", "language",
    "train", "training", "data", "file", "line", "message", "result", "value", "function", "class",
    "return", "error", "code", "test", "true", "false", "none", "list", "string", "print", "import",
)
# Labels and wording of a ticket-classification task: the task the learnability test trains.
TICKET_LABELS = ("delivery", "billing", "refund", "account", "technical", "other")
_TICKETS = {
    "delivery": ("The parcel never came.", "My package is late.", "The courier left it at the wrong door.",
                 "Tracking has not moved in a week.", "The box arrived damaged."),
    "billing": ("I was charged twice.", "The invoice shows the wrong amount.", "Why is there a fee on my card?",
                "My payment did not go through.", "The price on the bill is higher than the quote."),
    "refund": ("I want my money back.", "The refund has not arrived.", "Please refund the cancelled order.",
               "How long does a refund take?", "I returned the item but got no refund."),
    "account": ("I cannot log in.", "Please reset my password.", "How do I change my email address?",
                "My account was locked.", "Delete my account please."),
    "technical": ("The app crashes on start.", "The page shows an error.", "The website does not load.",
                  "Uploads fail with a timeout.", "The button does nothing when I click it."),
    "other": ("Do you have a store in Berlin?", "What are your opening hours?", "Can I speak to a person?",
              "Thanks for the quick help.", "Is there a student discount?"),
}
# Fixed text the families' chat templates write around messages.
_TEMPLATE_TEXT = (
    "system", "user", "assistant", "developer", "analysis", "commentary", "final",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n",
    "Reasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.",
    "# Instructions\n\n", "Classify the ticket.", "Classify the support ticket into one label.",
)


_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br", "ch", "cl",
           "cr", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "sp", "st", "str", "th", "tr")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oo", "io")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "st", "ng", "ck", "rt", "ll", "tion", "ment", "ing", "ed", "er")


def _pseudo_words(rng: random.Random, count: int) -> list[str]:
    """English-like made-up words: enough distinct sub-word pieces for a few thousand merges."""
    words = set()
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 3))
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(syllables)))
    return sorted(words)


def corpus(seed: int = 0, sentences: int = 6000) -> Iterator[str]:
    """Yield the corpus lines; the same seed always yields the same lines in the same order."""
    rng = random.Random(seed)
    lexicon = _pseudo_words(rng, 3000)
    # Zipf-like weights: frequent words merge into whole tokens, rare ones stay in pieces.
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    yield from _TEMPLATE_TEXT
    for label, texts in _TICKETS.items():
        for text in texts:
            yield f"Ticket: {text}\nLabel: {label}"
    for i in range(sentences):
        kind = i % 4
        if kind == 0:
            yield f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_TAILS)}."
        elif kind == 1:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
            yield " ".join(words).capitalize() + rng.choice((".", "?", "!", ","))
        elif kind == 2:
            words = rng.choices(lexicon, weights, k=rng.randint(8, 20))
            yield " ".join(words).capitalize() + "."
        else:
            label = rng.choice(TICKET_LABELS)
            yield f"{rng.choice(_TICKETS[label])} Order {rng.randint(1000, 99999)}: {label}\n"
