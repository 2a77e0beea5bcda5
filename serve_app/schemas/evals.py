"""The eval object (openai-python `types/eval_create_response.py` and its siblings, which share its
shape) and the delete answer (`eval_delete_response.py`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class EvalCustomDataSourceConfig(BaseModel):
    type: Literal["custom"] = "custom"
    schema_: dict[str, Any] = Field(serialization_alias="schema")
    """The JSON schema of a run's data: {"item": item_schema, "sample": ...} (sample when include_sample_schema)."""


class Eval(BaseModel):
    object: Literal["eval"] = "eval"
    id: str
    """`eval_` followed by 32 hex characters."""
    created_at: int
    """Unix seconds."""
    name: str
    metadata: dict[str, str] | None = None
    data_source_config: EvalCustomDataSourceConfig
    testing_criteria: list[dict[str, Any]]
    """The graders, as validated (graders/): string_check, text_similarity, python, score_model, label_model, multi."""


class EvalDeleted(BaseModel):
    object: Literal["eval.deleted"] = "eval.deleted"
    deleted: bool
    eval_id: str
