"""Constrained answers: the tokens a row may take next so that its whole answer has a given form.
OpenAI answers its model graders with structured output (a score_model's `result` is a number, a
label_model's one of its labels); a small open base asked for a score in words answers words. With
the form as a constraint on decoding, any base, an untrained stand-in included, answers one.

Two forms (graders/model_graders.py `NumberAnswer`, `ChoiceAnswer`), each a prefix test over what the row
generated so far:
- a number: `-?(0|[1-9][0-9]*)(\\.[0-9]+)?` whose value lies in [low, high]. A token is allowed
  when the text with it is still the prefix of some such number (the values a prefix can still
  reach are a union of intervals: "7" reaches 7, [7, 8) and [70, 80), [700, 800) ...); the
  end-of-turn token when the text is already one. Candidate tokens are the vocabulary's tokens made
  of digits, `.` and `-` alone (found once per tokenizer).
- a choice: one of the options, as the tokenizer encodes it; the next token of each option that
  the row's tokens still begin, or the end-of-turn token when they spell one whole.
A row with nothing left to take ends (end-of-turn). torch-free: the engine masks its logits with
the ids `allowed` returns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from graders.model_graders import ChoiceAnswer, NumberAnswer

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_PREFIX = re.compile(r"(-?)([0-9]*)(\.?)([0-9]*)")
_NUMBER_CHARS = re.compile(r"[0-9.\-]+")
NUMBER_REGEX = _NUMBER.pattern  # vLLM's structured output takes the same grammar (without the range)


def is_number(text: str, low: float, high: float) -> bool:
    return _NUMBER.fullmatch(text) is not None and low <= float(text) <= high


def reachable(text: str, low: float, high: float) -> bool:
    """Whether some number of the grammar in [low, high] begins with `text`."""
    m = _PREFIX.fullmatch(text)
    if m is None:
        return False
    sign, whole, dot, frac = m.groups()
    if not whole:
        return not (dot or frac) and (low <= 0 if sign else True)
    if len(whole) > 1 and whole[0] == "0":
        return False
    if dot:  # the magnitude lies in [whole.frac, whole.frac + one unit of its last place)
        start = float(f"{whole}.{frac or '0'}")
        spans = [(start, start + 10.0 ** -len(frac))]
    elif whole == "0":
        spans = [(0.0, 1.0)]
    else:  # more integer digits may follow, then a fraction
        value, bound, spans = int(whole), max(abs(low), abs(high)), []
        scale = 1
        while value * scale <= bound or not spans:
            spans.append((float(value * scale), float((value + 1) * scale)))
            scale *= 10
    for a, b in spans:
        if (not sign and a <= high and b > low) or (sign and -a >= low and -b < high):
            return True
    return False


class AnswerConstraint:
    """The allowed next tokens for one tokenizer's rows (built once per engine)."""

    def __init__(self, tokenizer, end_of_turn: Sequence[int]):
        self.tokenizer, self.end_of_turn = tokenizer, list(end_of_turn)
        self._number_tokens: dict[int, str] | None = None
        self._choices: dict[tuple[str, ...], list[tuple[int, ...]]] = {}

    def allowed(self, form: NumberAnswer | ChoiceAnswer, tokens: Sequence[int]) -> list[int]:
        if isinstance(form, NumberAnswer):
            return self._number(form, tokens)
        return self._choice(form, tokens)

    def number_tokens(self) -> dict[int, str]:
        if self._number_tokens is None:
            found = {}
            for piece, token_id in self.tokenizer.get_vocab().items():
                if _NUMBER_CHARS.fullmatch(piece) and self.tokenizer.decode([token_id]) == piece:
                    found[token_id] = piece
            self._number_tokens = found
        return self._number_tokens

    def _number(self, form: NumberAnswer, tokens: Sequence[int]) -> list[int]:
        pieces = self.number_tokens()
        text = "".join(pieces.get(t, "") for t in tokens)
        allowed = [t for t, piece in pieces.items() if reachable(text + piece, form.low, form.high)]
        if is_number(text, form.low, form.high) or not allowed:
            allowed += self.end_of_turn
        return allowed

    def _choice(self, form: ChoiceAnswer, tokens: Sequence[int]) -> list[int]:
        encoded = self._choices.get(form.options)
        if encoded is None:
            encoded = [tuple(self.tokenizer.encode(o, add_special_tokens=False)) for o in form.options]
            self._choices[form.options] = encoded
        done, n = tuple(tokens), len(tokens)
        allowed = sorted({seq[n] for seq in encoded if len(seq) > n and seq[:n] == done})
        if done in encoded or not allowed:
            allowed += self.end_of_turn
        return allowed
