"""The `limit` rule every list endpoint shares, and the page it answers."""

from __future__ import annotations

from openft.errors import InvalidRequest
from serve_app.schemas.common import Page


def check_limit(limit: int, maximum: int) -> None:
    if not 1 <= limit <= maximum:
        raise InvalidRequest(f"limit must be between 1 and {maximum}.", code="invalid_value", param="limit")


def page_of(data: list, has_more: bool) -> Page:
    """OpenAI's cursor page over `data` (objects with an `id`), typed by its first item's class."""
    model = Page[type(data[0])] if data else Page
    return model(data=data, has_more=has_more, first_id=data[0].id if data else None,
                 last_id=data[-1].id if data else None)
