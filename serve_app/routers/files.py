"""HTTP routes of the Files resource (`/v1/files`); logic in serve_app.services.files*."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account, upload_slot
from serve_app.downloads import digest_stream
from serve_app.request_body import json_object
from serve_app.schemas.common import Page
from serve_app.schemas.files import FileDeleted, FileObject
from serve_app.services import files as service
from serve_app.services.distill import distill
from serve_app.services.files_upload import upload_file
from storage.models import Account

router = APIRouter(prefix="/files", tags=["files"])


@router.post("", response_model=FileObject, dependencies=[Depends(upload_slot, scope="function")])
async def create_file(request: Request, account: Account = Depends(current_account)):
    state = request.app.state.openft
    row = await upload_file(state, account, request.headers, request.stream())
    return service.file_object(row)


@router.post("/distill")
async def distill_files(request: Request, account: Account = Depends(current_account)) -> dict:
    """Batch requests + results -> a training file and a held-out validation file (gridline)."""
    body = await json_object(request)
    return await run_in_threadpool(distill, request.app.state.openft, account, body)


@router.get("", response_model=Page[FileObject])
def list_files(
    request: Request,
    purpose: str | None = None,
    limit: int = Query(10_000),
    after: str | None = None,
    order: str = "desc",
    account: Account = Depends(current_account),
) -> Page[FileObject]:
    return service.list_files(request.app.state.openft, account, purpose=purpose, limit=limit, after=after, order=order)


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, request: Request, account: Account = Depends(current_account)) -> FileObject:
    return service.retrieve_file(request.app.state.openft, account, file_id)


@router.get("/{file_id}/content")
@router.head("/{file_id}/content", include_in_schema=False)
def retrieve_file_content(file_id: str, request: Request, account: Account = Depends(current_account)):
    row, chunks = service.file_content(request.app.state.openft, account, file_id)
    return digest_stream(chunks, sha256=row.sha256, size=row.bytes, head=request.method == "HEAD")


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, request: Request, account: Account = Depends(current_account)) -> FileDeleted:
    state = request.app.state.openft
    return service.delete_file(state, account, file_id, in_use=state.file_in_use)
