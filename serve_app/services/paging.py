"""The `limit` rule every list endpoint shares."""

from __future__ import annotations

from openft.errors import InvalidRequest


def check_limit(limit: int, maximum: int) -> None:
    if not 1 <= limit <= maximum:
        raise InvalidRequest(f"limit must be between 1 and {maximum}.", code="invalid_value", param="limit")
