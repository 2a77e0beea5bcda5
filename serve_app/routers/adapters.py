"""HTTP routes under `/v1/gridline`: adapter downloads, merged weights (`/adapters/{model}/merged`),
and the signed download URLs of the local storage backend (`/blobs/{token}`, no bearer key: the
signature is the credential; see serve_app/services/merges.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse

from serve_app.auth import current_account
from serve_app.downloads import digest_stream
from serve_app.schemas.merges import MergedWeights, MergedWeightsDeleted
from serve_app.services import merges
from serve_app.services import models as service
from storage.models import Account

router = APIRouter(prefix="/gridline", tags=["adapters"])


@router.get("/adapters/{model}/files/{name}")
def download_adapter_file(model: str, name: str, request: Request, account: Account = Depends(current_account)):
    sha256, size, chunks = service.adapter_file(request.app.state.openft, account, model, name)
    return digest_stream(chunks, sha256=sha256, size=size, name=name)


@router.post("/adapters/{model}/merged", response_model=MergedWeights)
def create_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.start_merge(request.app.state.openft, account, model)


@router.get("/adapters/{model}/merged", response_model=MergedWeights)
def retrieve_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.get_merged(request.app.state.openft, account, model)


@router.delete("/adapters/{model}/merged", response_model=MergedWeightsDeleted)
def delete_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.delete_merged(request.app.state.openft, account, model)


@router.get("/adapters/{model}/merged/files/{path:path}")
def download_merged_file(model: str, path: str, request: Request, account: Account = Depends(current_account)):
    url, sha256 = merges.merged_file_url(
        request.app.state.openft, account, model, path, lambda token: str(request.url_for("download_blob", token=token))
    )
    return RedirectResponse(url, status_code=302, headers={"x-gridline-sha256": sha256})


@router.get("/blobs/{token}", name="download_blob")
def download_blob(token: str, request: Request):
    payload, chunks = merges.open_blob(request.app.state.openft, token)
    return digest_stream(chunks, sha256=payload["s"], size=payload["b"], name=payload["n"], attachment=True)
