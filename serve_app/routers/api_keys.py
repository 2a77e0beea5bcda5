"""HTTP routes of an account's own API keys (`/v1/gridline/api_keys`); the operator's are in
serve_app/routers/admin.py. Logic in serve_app/services/api_keys.py."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from serve_app.auth import current_account
from serve_app.schemas.api_keys import ApiKey, ApiKeyCreateRequest, ApiKeyDeleted, ApiKeyWithValue
from serve_app.schemas.common import Page
from serve_app.services import api_keys as service
from storage.models import Account

router = APIRouter(prefix="/gridline/api_keys", tags=["api_keys"])


@router.get("", response_model=Page[ApiKey])
def list_api_keys(request: Request, after: str | None = None, limit: int = Query(20),
                  account: Account = Depends(current_account)):
    return service.list_keys(request.app.state.openft.db, account.id, limit=limit, after=after)


@router.post("", response_model=ApiKeyWithValue)
def create_api_key(body: ApiKeyCreateRequest, request: Request, account: Account = Depends(current_account)):
    state = request.app.state.openft
    return service.create_key(state.db, state.settings, account.id, body, state.now())


@router.get("/{key_id}", response_model=ApiKey)
def retrieve_api_key(key_id: str, request: Request, account: Account = Depends(current_account)):
    return service.retrieve_key(request.app.state.openft.db, account.id, key_id)


@router.delete("/{key_id}", response_model=ApiKeyDeleted)
def delete_api_key(key_id: str, request: Request, account: Account = Depends(current_account)):
    state = request.app.state.openft
    return service.revoke_key(state.db, account.id, key_id, state.now())
