"""Path and query parameters with a NUL character are refused before any handler runs.

No id, cursor or filter of this API contains one, and PostgreSQL cannot compare text with a NUL
in it (the driver raises, which answered 500 on nearly every route); SQLite just finds nothing.
One check on the /v1 router keeps both backends answering the same 400.
"""

from __future__ import annotations

from fastapi import Request

from openft.errors import InvalidRequest


def refuse_nul_params(request: Request) -> None:
    params = [*request.path_params.items(), *request.query_params.multi_items()]
    for name, value in params:
        if "\x00" in value or "\x00" in name:
            param = name if "\x00" not in name and len(name) <= 64 else None
            raise InvalidRequest("Parameters must not contain NUL characters.", code="invalid_value", param=param)
