"""Shapes shared by every resource: OpenAI's cursor page."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    """The page's objects, in the requested order."""
    has_more: bool
    """Whether another page follows; pass the last id as `after` to read it."""
    first_id: str | None = None
    last_id: str | None = None
