"""The model object (openai-python `Model`, `ModelDeleted`) with a `gridline` extension for `ft:` models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class Model(BaseModel):
    id: str
    """A base id from the catalog, or an `ft:<base>:<org>:<job suffix>` name."""
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    """`openft` for catalog bases; the owner's organization id for `ft:` models."""
    gridline: dict[str, Any] | None = None
    """`ft:` models: `{base, job, servable, reason}`; bases: `{hf_repo, revision, licence, servable}`."""


class ModelDeleted(BaseModel):
    id: str
    object: Literal["model"] = "model"
    deleted: bool
