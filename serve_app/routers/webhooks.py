"""HTTP routes of webhook endpoints (`/v1/webhook_endpoints`, `/v1/webhook_event_types`) and the
owner's delivery log (`/v1/gridline/webhook_endpoints/{id}/deliveries`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from serve_app.auth import current_account
from serve_app.request_body import json_object
from serve_app.schemas.common import Page
from serve_app.schemas.webhooks import (
    DeletedWebhookEndpoint,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)
from serve_app.services import webhooks as service
from storage.models import Account

router = APIRouter(tags=["webhooks"])


async def _optional_body(request: Request) -> dict:
    """rotate_secret's parameters are all optional: a POST without a body means none."""
    return await json_object(request) if await request.body() else {}


@router.post("/webhook_endpoints", response_model=WebhookEndpointWithSecret)
async def create_webhook_endpoint(request: Request, account: Account = Depends(current_account)):
    body = await json_object(request)
    return await run_in_threadpool(service.create_endpoint, request.app.state.openft, account, body)


@router.get("/webhook_endpoints", response_model=Page[WebhookEndpoint])
def list_webhook_endpoints(request: Request, after: str | None = None, limit: int = Query(20),
                           account: Account = Depends(current_account)):
    return service.list_endpoints(request.app.state.openft, account, limit=limit, after=after)


@router.get("/webhook_endpoints/{webhook_endpoint_id}", response_model=WebhookEndpoint)
def retrieve_webhook_endpoint(webhook_endpoint_id: str, request: Request, account: Account = Depends(current_account)):
    return service.retrieve_endpoint(request.app.state.openft, account, webhook_endpoint_id)


@router.post("/webhook_endpoints/{webhook_endpoint_id}", response_model=WebhookEndpoint)
async def update_webhook_endpoint(webhook_endpoint_id: str, request: Request,
                                  account: Account = Depends(current_account)):
    body = await json_object(request)
    return await run_in_threadpool(service.update_endpoint, request.app.state.openft, account, webhook_endpoint_id, body)


@router.delete("/webhook_endpoints/{webhook_endpoint_id}", response_model=DeletedWebhookEndpoint)
def delete_webhook_endpoint(webhook_endpoint_id: str, request: Request, account: Account = Depends(current_account)):
    return service.delete_endpoint(request.app.state.openft, account, webhook_endpoint_id)


@router.post("/webhook_endpoints/{webhook_endpoint_id}/rotate_secret", response_model=WebhookEndpointWithSecret)
async def rotate_webhook_secret(webhook_endpoint_id: str, request: Request, account: Account = Depends(current_account)):
    body = await _optional_body(request)
    return await run_in_threadpool(service.rotate_secret, request.app.state.openft, account, webhook_endpoint_id, body)


@router.post("/webhook_endpoints/{webhook_endpoint_id}/test", response_model=WebhookEndpointTestResult)
async def test_webhook_endpoint(webhook_endpoint_id: str, request: Request, account: Account = Depends(current_account)):
    body = await json_object(request)
    # It POSTs to the endpoint and waits for its answer: off the event loop.
    return await run_in_threadpool(service.send_test_event, request.app.state.openft, account, webhook_endpoint_id, body)


@router.get("/webhook_event_types", response_model=WebhookEventTypeList)
def list_webhook_event_types(account: Account = Depends(current_account)):
    return service.event_types()


@router.get("/gridline/webhook_endpoints/{webhook_endpoint_id}/deliveries", response_model=Page[WebhookDelivery])
def list_webhook_deliveries(webhook_endpoint_id: str, request: Request, after: str | None = None,
                            limit: int = Query(20), account: Account = Depends(current_account)):
    return service.list_deliveries(request.app.state.openft, account, webhook_endpoint_id, limit=limit, after=after)
