"""HTTP routes of the operators' API (`/v1/gridline/admin/accounts/...`): add credit, read an
account's balance, usage and limits, set limits, list its ledger; list, create and revoke its API
keys.

It takes its own bearer key, `Settings.admin_key` (OPENFT_ADMIN_KEY); account keys never work
here. Without an admin key configured the routes answer 404 like any unknown route, so a
deployment that does not use them does not reveal them.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Query, Request

from openft.errors import NotFound, Unauthorized
from serve_app.schemas.api_keys import ApiKey, ApiKeyCreateRequest, ApiKeyDeleted, ApiKeyWithValue
from serve_app.schemas.billing import BillingAccount, CreditRequest, LedgerEntry, LimitsRequest
from serve_app.schemas.common import Page
from serve_app.services import api_keys
from serve_app.services import billing as service


def require_admin(request: Request) -> None:
    expected = request.app.state.openft.settings.admin_key
    if not expected:
        raise NotFound("Unknown route.")
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), expected.encode()):
        raise Unauthorized("Incorrect admin key provided.", code="invalid_api_key")


router = APIRouter(prefix="/gridline/admin/accounts", tags=["admin"], dependencies=[Depends(require_admin)])


@router.get("/{account}", response_model=BillingAccount)
def retrieve_account_billing(account: str, request: Request) -> BillingAccount:
    state = request.app.state.openft
    return service.account_summary(state.db, state.settings, account, state.now())


@router.post("/{account}/credits", response_model=BillingAccount)
def create_account_credit(account: str, body: CreditRequest, request: Request) -> BillingAccount:
    state = request.app.state.openft
    return service.add_credit(state.db, state.settings, account, body.usd, state.now(), note=body.note,
                              key=body.idempotency_key)


@router.post("/{account}/limits", response_model=BillingAccount)
def update_account_limits(account: str, body: LimitsRequest, request: Request) -> BillingAccount:
    state = request.app.state.openft
    return service.set_limits(state.db, state.settings, account, state.now(), open_jobs=body.open_jobs,
                              usd_per_day=body.usd_per_day, models=body.models)


@router.get("/{account}/ledger", response_model=Page[LedgerEntry])
def list_account_ledger(account: str, request: Request, after: int | None = None, limit: int = Query(20)):
    return service.list_ledger(request.app.state.openft.db, account, limit=limit, after=after)


@router.get("/{account}/api_keys", response_model=Page[ApiKey])
def list_account_api_keys(account: str, request: Request, after: str | None = None, limit: int = Query(20)):
    db = request.app.state.openft.db
    return api_keys.list_keys(db, api_keys.account_id_of(db, account), limit=limit, after=after)


@router.post("/{account}/api_keys", response_model=ApiKeyWithValue)
def create_account_api_key(account: str, body: ApiKeyCreateRequest, request: Request):
    state = request.app.state.openft
    return api_keys.create_key(state.db, state.settings, api_keys.account_id_of(state.db, account), body, state.now())


@router.delete("/{account}/api_keys/{key_id}", response_model=ApiKeyDeleted)
def delete_account_api_key(account: str, key_id: str, request: Request):
    state = request.app.state.openft
    return api_keys.revoke_key(state.db, api_keys.account_id_of(state.db, account), key_id, state.now())
