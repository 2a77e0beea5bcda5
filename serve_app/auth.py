"""Route dependencies that admit a request: the bearer key of every /v1 route (a working key of the
account: serve_app/services/api_keys.py), and the rate limits of `serve_app.rate_limits` (the
general bucket here, the stricter one and upload slots by route)."""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import Depends, Request

from openft.errors import Unauthorized
from serve_app import rate_limits
from serve_app.services.api_keys import authenticate
from storage.models import Account


def current_account(request: Request) -> Account:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Missing API key: send it as 'Authorization: Bearer KEY'.", code="missing_api_key")
    state = request.app.state.openft
    # One session for the key and its bucket: the limit costs one statement, not a transaction.
    with state.db.session() as session:
        account = authenticate(session, key.strip(), state.now())
        refusal = rate_limits.take(session, state.settings, account.id, rate_limits.GENERAL)
    if refusal is not None:
        raise refusal
    return account


def heavy_request(request: Request, account: Account = Depends(current_account)) -> Account:
    """Uploads and job creates: the key's stricter bucket, on top of the general one."""
    state = request.app.state.openft
    if rate_limits.limited(state.settings, rate_limits.HEAVY):
        with state.db.session() as session:
            refusal = rate_limits.take(session, state.settings, account.id, rate_limits.HEAVY)
        if refusal is not None:
            raise refusal
    return account


async def upload_slot(request: Request, account: Account = Depends(heavy_request)) -> AsyncIterator[None]:
    """Uploads: one of the account's slots, held while the handler runs. Used with
    scope="function", so that the slot is free again before the client has the answer."""
    async with rate_limits.upload_slot(request.app.state.openft, account.id):
        yield
