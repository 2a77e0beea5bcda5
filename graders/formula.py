"""A multi grader's `calculate_output`: an arithmetic expression over its graders' names, parsed
into a tree by a small recursive-descent parser and evaluated over floats. Never Python's `eval`.

Grammar (OpenAI's operators and functions):
    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("+" | "-") unary | power
    power  := atom ("^" unary)?            right-associative: 2^3^2 = 2^9
    atom   := number | name | func "(" expr ("," expr)* ")" | "(" expr ")"
    func   := min | max | abs | floor | ceil | exp | sqrt | log   (log is the natural logarithm)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from openft.errors import ECHOED_NAME_CHARS, InvalidRequest

FUNCTIONS = {
    "min": (1, None, min), "max": (1, None, max), "abs": (1, 1, abs), "floor": (1, 1, math.floor),
    "ceil": (1, 1, math.ceil), "exp": (1, 1, math.exp), "sqrt": (1, 1, math.sqrt), "log": (1, 1, math.log),
}
MAX_FORMULA_CHARS = 4096
MAX_DEPTH = 64  # nesting: a deeper formula is refused rather than recursing without bound
_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?|([A-Za-z_][A-Za-z0-9_]*)|(\S))")


class FormulaError(ValueError):
    """A formula that cannot be parsed, or one that names what is not there (`message` says which)."""


@dataclass(frozen=True)
class Formula:
    tree: tuple
    names: frozenset[str]  # every variable the formula reads

    def evaluate(self, values: Mapping[str, float]) -> float:
        """Raises ArithmeticError or ValueError (division by zero, sqrt or log of a negative)."""
        return float(_eval(self.tree, values))


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:  # only whitespace is left
            break
        pos = match.end()
        if match[1] is not None:
            out.append(("num", match[0].strip()))
        elif match[2] is not None:
            out.append(("name", match[2]))
        else:
            out.append(("op", match[3]))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.pos, self.names, self.depth = tokens, 0, set(), 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, op: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (op is not None and tok != ("op", op)):
            raise FormulaError(f"expected {op!r}" if op else "the formula ends too early")
        self.pos += 1
        return tok

    def expr(self) -> tuple:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels")
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            node = (self.take()[1], node, self.term())
        self.depth -= 1
        return node

    def term(self) -> tuple:
        node = self.unary()
        while self.peek() in (("op", "*"), ("op", "/")):
            node = (self.take()[1], node, self.unary())
        return node

    def unary(self) -> tuple:
        if self.peek() in (("op", "-"), ("op", "+")):
            sign = self.take()[1]
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels")
            inner = self.unary()
            self.depth -= 1
            return ("neg", inner) if sign == "-" else inner
        return self.power()

    def power(self) -> tuple:
        node = self.atom()
        if self.peek() == ("op", "^"):
            self.take()
            node = ("^", node, self.unary())
        return node

    def atom(self) -> tuple:
        kind, text = self.take()
        if kind == "num":
            return ("num", float(text))
        if kind == "op":
            if text != "(":
                raise FormulaError(f"unexpected {text!r}")
            node = self.expr()
            self.take(")")
            return node
        if self.peek() == ("op", "("):
            if text not in FUNCTIONS:
                raise FormulaError(f"{_named(text)} is not a function: use " + ", ".join(FUNCTIONS))
            self.take("(")
            args = [self.expr()]
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.expr())
            self.take(")")
            low, high, _ = FUNCTIONS[text]
            if len(args) < low or (high is not None and len(args) > high):
                raise FormulaError(f"{text} takes {'one argument' if high == 1 else 'one or more arguments'}")
            return ("call", text, tuple(args))
        self.names.add(text)
        return ("var", text)


def _named(name: str) -> str:
    return repr(name) if len(name) <= ECHOED_NAME_CHARS else "a name over 64 characters"


def parse(text: str, variables: frozenset[str] | set[str] | None = None) -> Formula:
    """The formula's tree; with `variables`, a name that is not one of them is refused."""
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"the formula is over {MAX_FORMULA_CHARS} characters")
    parser = _Parser(_tokens(text))
    if not parser.tokens:
        raise FormulaError("the formula is empty")
    tree = parser.expr()
    if parser.peek() is not None:
        raise FormulaError(f"unexpected {parser.peek()[1]!r} after a complete expression")
    if variables is not None:
        unknown = sorted(parser.names - set(variables))
        if unknown:
            raise FormulaError(f"{_named(unknown[0])} is not one of the graders' names (" + ", ".join(sorted(variables)) + ")")
    return Formula(tree, frozenset(parser.names))


def parse_param(text: str, variables, param: str) -> Formula:
    """`parse`, its refusal as a 400 on `param`."""
    try:
        return parse(text, variables)
    except FormulaError as exc:
        raise InvalidRequest(f"{param} cannot be used: {exc}.", code="invalid_formula", param=param) from None


def _eval(node: tuple, values: Mapping[str, float]) -> float:
    op = node[0]
    if op == "num":
        return node[1]
    if op == "var":
        return float(values[node[1]])
    if op == "neg":
        return -_eval(node[1], values)
    if op == "call":
        fn = FUNCTIONS[node[1]][2]
        args = [_eval(a, values) for a in node[2]]
        return float(fn(*args) if node[1] in ("min", "max") else fn(args[0]))
    a, b = _eval(node[1], values), _eval(node[2], values)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    result = a**b  # "^": a negative base with a fractional exponent is complex in Python
    if isinstance(result, complex):
        raise ValueError("a negative number to a fractional power")
    return result
