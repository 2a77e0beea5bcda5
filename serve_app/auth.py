"""Bearer-key authentication for every /v1 route."""

from __future__ import annotations

from fastapi import Request

from openft.errors import Unauthorized
from storage.accounts import account_for_key
from storage.models import Account


def current_account(request: Request) -> Account:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Missing API key: send it as 'Authorization: Bearer KEY'.", code="missing_api_key")
    state = request.app.state.openft
    with state.db.session() as session:
        account = account_for_key(session, key.strip())
    if account is None:
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
    return account
