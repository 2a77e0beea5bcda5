"""A stored object streamed to the caller with its SHA-256 and size, as every download route sends it."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi.responses import StreamingResponse


def digest_stream(chunks: Iterable[bytes], *, sha256: str, size: int, name: str | None = None,
                  attachment: bool = False) -> StreamingResponse:  # fmt: skip
    """`name` picks the media type (JSON for `.json`); `attachment` names it in Content-Disposition."""
    headers = {"x-gridline-sha256": sha256, "content-length": str(size)}
    if attachment and name:
        headers["content-disposition"] = f'attachment; filename="{name}"'
    media = "application/json" if name and name.endswith(".json") else "application/octet-stream"
    return StreamingResponse(chunks, media_type=media, headers=headers)
