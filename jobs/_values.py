"""The value checks job create's parsers share (jobs/params.py, jobs/reinforcement.py): each refusal is
`InvalidRequest` (400) `invalid_value` naming the dotted param the caller used."""

from __future__ import annotations

import math
from typing import Any

from openft.errors import InvalidRequest


def invalid(message: str, param: str | None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def int_in(value: Any, param: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        bound = f"from {lo} to {hi}" if hi < 10**9 else f"of at least {lo}"
        raise invalid(f"{param} must be an integer {bound}.", param)
    return value


def float_in(value: Any, param: str, lo: float, hi: float, *, open_low: bool = False) -> float:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (lo < value if open_low else lo <= value)
        and value <= hi
    )
    if not ok:
        low = f"above {lo:g}" if open_low else f"from {lo:g}"
        raise invalid(f"{param} must be a number {low} to {hi:g}.", param)
    return float(value)
