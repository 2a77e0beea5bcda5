"""Wire objects of the merged-weights API: the status object and the deletion answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class MergedFile(BaseModel):
    path: str
    """The file's path in the export; download it at `.../merged/files/{path}`."""
    bytes: int
    sha256: str
    """Hex SHA-256 of the file's bytes; each download's redirect carries it in `x-gridline-sha256`."""


class MergeErrorInfo(BaseModel):
    code: str
    """A code of the reference's failed-merge table, e.g. `merge_adapter_dtype` or `merge_weights_gone`."""
    message: str


class MergedWeights(BaseModel):
    object: Literal["gridline.merged_weights"] = "gridline.merged_weights"
    model: str
    """The `ft:` model merged into its base."""
    status: Literal["queued", "running", "succeeded", "failed", "expired"]
    created_at: int
    """Unix seconds when the merge was requested."""
    finished_at: int | None
    """Unix seconds when it succeeded or failed; null while queued or running."""
    expires_at: int | None
    """Unix seconds when a succeeded export is deleted (7 days after it finished)."""
    files: list[MergedFile]
    """Every file of the export, `gridline_merge.json` included; empty unless `succeeded`."""
    error: MergeErrorInfo | None
    """Why the merge failed; null unless `failed`."""


class MergedWeightsDeleted(BaseModel):
    object: Literal["gridline.merged_weights.deleted"] = "gridline.merged_weights.deleted"
    model: str
    deleted: bool
    """True when the export was deleted or a queued merge cancelled at once; false when the merge
    is running: it is stopped when it ends and then reads `failed` with `merge_weights_gone`."""
