"""Tests of the job package; `file_facts` is the files-table row its pure checks and quote share."""

from __future__ import annotations

from jobs.params import FileFacts


def file_facts(**overrides) -> FileFacts:
    """A processed chat file of 2,000 rows whose qwen2.5-7b-instruct estimate is 1,000,000 tokens."""
    fields = dict(
        id="file-train",
        purpose="fine-tune",
        status="processed",
        bytes=5_000_000,
        row_kind="chat",
        rows=2000,
        messages=6000,
        content_bytes=4_000_000,
        token_upper_bound=1_300_000,
        token_estimates={"qwen2.5-7b-instruct": 1_000_000},
    )
    fields.update(overrides)
    return FileFacts(**fields)
