"""HTTP routes under `/v1/gridline/adapters/{model}`: adapter downloads (merged weights come later)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from serve_app.auth import current_account
from serve_app.services import models as service
from storage.models import Account

router = APIRouter(prefix="/gridline/adapters", tags=["adapters"])


@router.get("/{model}/files/{name}")
def download_adapter_file(model: str, name: str, request: Request, account: Account = Depends(current_account)):
    sha256, size, chunks = service.adapter_file(request.app.state.openft, account, model, name)
    media = "application/json" if name.endswith(".json") else "application/octet-stream"
    return StreamingResponse(chunks, media_type=media, headers={"x-gridline-sha256": sha256, "content-length": str(size)})
