"""Rules for what a request's parameters and headers carry, before any handler runs.

Path and query parameters with a NUL character are refused: no id, cursor or filter of this API
contains one, and PostgreSQL cannot compare text with a NUL in it (the driver raises, which
answered 500 on nearly every route); SQLite just finds nothing. One check on the /v1 router keeps
both backends answering the same 400.

A count from a header (a Range position, a Content-Length) is read with `bounded_count`: more than
18 digits is past every file and body this service has, so it reads as BEYOND and is never
converted whole (Python's int() of a long string costs time and raises past 4,300 digits: a
4,301-digit Range answered 500). Query integers go through pydantic, which refuses more than 4,300.
"""

from __future__ import annotations

from fastapi import Request

from openft.errors import InvalidRequest

MAX_DIGITS = 18
BEYOND = 10**MAX_DIGITS


def bounded_count(digits: str) -> int:
    """A non-negative count written in ASCII digits (the caller checked), BEYOND past MAX_DIGITS."""
    digits = digits.lstrip("0") or "0"
    return BEYOND if len(digits) > MAX_DIGITS else int(digits)


def refuse_nul_params(request: Request) -> None:
    params = [*request.path_params.items(), *request.query_params.multi_items()]
    for name, value in params:
        if "\x00" in value or "\x00" in name:
            param = name if "\x00" not in name and len(name) <= 64 else None
            raise InvalidRequest("Parameters must not contain NUL characters.", code="invalid_value", param=param)
