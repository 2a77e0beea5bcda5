"""HTTP routes under `/v1/gridline`: adapter downloads, merged weights (`/adapters/{model}/merged`),
and the download URLs of the local storage backend (`/blobs/{token}`, no bearer key: the opaque token
is the credential; see serve_app/services/merges.py). The downloads answer HEAD as they answer GET,
without the body."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse

from serve_app.auth import current_account
from serve_app.downloads import ByteRange, digest_stream
from serve_app.schemas.merges import MergedWeights, MergedWeightsDeleted
from serve_app.services import merges
from serve_app.services import models as service
from storage.models import Account

router = APIRouter(prefix="/gridline", tags=["adapters"])


@router.get("/adapters/{model}/files/{name}")
@router.head("/adapters/{model}/files/{name}", include_in_schema=False)
def download_adapter_file(model: str, name: str, request: Request, account: Account = Depends(current_account)):
    ranged, head = ByteRange.parse(request.headers.get("range")), request.method == "HEAD"
    # HEAD opens the object (a missing one is 404 as for GET) but reads no span of it.
    sha256, size, chunks = service.adapter_file(request.app.state.openft, account, model, name,
                                                None if head else ranged)
    return digest_stream(chunks, sha256=sha256, size=size, name=name, ranged=ranged, head=head)


@router.post("/adapters/{model}/merged", response_model=MergedWeights)
def create_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.start_merge(request.app.state.openft, account, model)


@router.get("/adapters/{model}/merged", response_model=MergedWeights)
def retrieve_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.get_merged(request.app.state.openft, account, model)


@router.delete("/adapters/{model}/merged", response_model=MergedWeightsDeleted)
def delete_merged_weights(model: str, request: Request, account: Account = Depends(current_account)):
    return merges.delete_merged(request.app.state.openft, account, model)


def _blob_url(request: Request, token: str) -> str:
    """Under `Settings.public_base_url`, else relative to this app's mount point (the Serve route
    prefix, from the deployment, not the client): never built from the request's Host or
    X-Forwarded-* headers, which any client can set."""
    path = request.app.url_path_for("download_blob", token=token)
    base = request.app.state.openft.settings.public_base_url
    return f"{base}{path}" if base else f"{request.scope.get('root_path', '').rstrip('/')}{path}"


@router.get("/adapters/{model}/merged/files/{path:path}")
@router.head("/adapters/{model}/merged/files/{path:path}", include_in_schema=False)
def download_merged_file(model: str, path: str, request: Request, account: Account = Depends(current_account)):
    url, sha256 = merges.merged_file_url(
        request.app.state.openft, account, model, path, lambda token: _blob_url(request, token)
    )
    return RedirectResponse(url, status_code=302, headers={"x-gridline-sha256": sha256})


@router.get("/blobs/{token}", name="download_blob")
@router.head("/blobs/{token}", include_in_schema=False)
def download_blob(token: str, request: Request):
    ranged, head = ByteRange.parse(request.headers.get("range")), request.method == "HEAD"
    blob, chunks = merges.open_blob(request.app.state.openft, token, None if head else ranged)
    return digest_stream(chunks, sha256=blob.sha256, size=blob.size, name=blob.name, attachment=True, ranged=ranged,
                         head=head)
