"""HTTP routes of the Models resource (`/v1/models`). Model names contain colons (`ft:...`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from serve_app.auth import current_account
from serve_app.schemas.common import Page
from serve_app.schemas.models import Model, ModelDeleted
from serve_app.services import models as service
from storage.models import Account

router = APIRouter(prefix="/models", tags=["models"])


@router.get("", response_model=Page[Model])
def list_models(request: Request, account: Account = Depends(current_account)):
    return service.list_models(request.app.state.openft, account)


@router.get("/{model:path}", response_model=Model)
def retrieve_model(model: str, request: Request, account: Account = Depends(current_account)):
    return service.retrieve_model(request.app.state.openft, account, model)


@router.delete("/{model:path}", response_model=ModelDeleted)
def delete_model(model: str, request: Request, account: Account = Depends(current_account)):
    return service.delete_model(request.app.state.openft, account, model)
