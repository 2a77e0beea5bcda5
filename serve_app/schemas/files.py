"""The file object (openai-python `FileObject`, `FileDeleted`) and its `gridline` extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

FilePurpose = Literal["fine-tune", "batch", "batch_output", "fine-tune-results", "evals"]
# evals: a JSONL of {"item": {...}} lines (and "sample"), the data of eval runs (issue 25).
UPLOAD_PURPOSES = ("fine-tune", "batch", "batch_output", "evals")


class FileGridline(BaseModel):
    sha256: str
    """SHA-256 of the stored bytes, hex."""
    row_kind: Literal["chat", "preference", "reinforcement"] | None = None
    """Fine-tune files: whether rows are chat rows (supervised), preference rows (DPO) or prompts for
    reinforcement fine-tuning (messages ending with a user turn, plus the grader's item fields)."""
    rows: int | None = None
    """Rows (lines) in the file."""
    messages: int | None = None
    """Messages over all rows (preference rows count input plus both outputs)."""
    content_bytes: int | None = None
    """UTF-8 bytes of all message contents."""
    token_upper_bound: int | None = None
    """Tokens can not exceed this on any base: content bytes plus the largest template overhead."""
    token_estimates: dict[str, int] | None = None
    """Per base id: a conservative estimate, at or above the real count on ordinary text."""
    derived_from: dict[str, Any] | None = None
    """For files made by the service (distillation): the source files and options."""


class FileObject(BaseModel):
    id: str
    """`file-` followed by 24 hex characters."""
    object: Literal["file"] = "file"
    bytes: int
    """Size of the stored file in bytes."""
    created_at: int
    """Unix seconds of the upload."""
    expires_at: int | None
    """Unix seconds after which the file is deleted (30 days after upload), unless a running job uses it."""
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"]
    """`processed` once validated; refused uploads are never stored."""
    status_details: str | None = None
    gridline: FileGridline


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
