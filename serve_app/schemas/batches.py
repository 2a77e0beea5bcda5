"""The batch (openai-python `Batch`, `BatchError`, `BatchRequestCounts`, `BatchUsage`), field for
field, plus the `gridline` extension."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]


class BatchError(BaseModel):
    code: str | None = None
    """A fixed error code."""
    line: int | None = None
    """The input file's line the error is about, where it is about one."""
    message: str | None = None
    """What happened and what to do; never a line's content."""
    param: str | None = None


class Errors(BaseModel):
    data: list[BatchError] | None = None
    object: str | None = "list"


class BatchRequestCounts(BaseModel):
    completed: int
    """Lines answered (in the output file)."""
    failed: int
    """Lines that failed (in the error file)."""
    total: int
    """Request lines in the input file."""


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int
    """Prompt tokens of the completed lines, counted with the base's tokenizer."""
    input_tokens_details: InputTokensDetails
    output_tokens: int
    """Completion tokens of the completed lines."""
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchGridline(BaseModel):
    base: str
    """The base every line runs on."""
    models: list[str]
    """The models the batch runs: the base (when a line names it) and up to 8 of its fine-tunes."""
    refused_models: dict[str, dict[str, Any]]
    """Models lines name that cannot run ({status_code, code, message}); their lines go to the error file."""
    quote: dict[str, Any] | None = None
    """Billing on: `{tokens_upper_bound, batch_usd_per_mtok, max_charge_usd}`, held when the batch starts."""
    charge: dict[str, Any] | None = None
    """Billing on, once it ends: `{usd, cents, basis, tokens, batch_usd_per_mtok}`; never more than the hold."""


class Batch(BaseModel):
    id: str
    """`batch_` followed by 24 hex characters."""
    completion_window: str
    """Always `24h`."""
    created_at: int
    endpoint: str
    """Always `/v1/chat/completions`."""
    input_file_id: str
    object: Literal["batch"] = "batch"
    status: BatchStatus
    cancelled_at: int | None = None
    cancelling_at: int | None = None
    completed_at: int | None = None
    error_file_id: str | None = None
    """A file (purpose `batch_output`) of the lines that failed; null when none did."""
    errors: Errors | None = None
    expired_at: int | None = None
    expires_at: int | None = None
    failed_at: int | None = None
    finalizing_at: int | None = None
    in_progress_at: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    """The base the batch runs on."""
    output_file_id: str | None = None
    """A file (purpose `batch_output`) of the lines answered; null when none was."""
    request_counts: BatchRequestCounts | None = None
    usage: BatchUsage | None = None
    gridline: BatchGridline
