"""Webhook endpoints (openai-python `types/webhooks/webhook_endpoint*.py`,
`deleted_webhook_endpoint.py`, `webhook_event_type_list.py`), field for field, and the
`gridline` delivery log."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class WebhookEndpoint(BaseModel):
    id: str
    """`wh_` followed by 24 hex characters."""
    created_at: int
    event_types: list[str]
    """The event types that trigger deliveries to this endpoint."""
    name: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    signing_secret_hint: str | None = None
    """`whsec_...` and the secret's last 4 characters."""
    url: str
    """The http(s) URL deliveries are POSTed to."""
    updated_at: int | None = None
    """The last change of the URL, name, event types or secret; an update that changes nothing leaves it."""


class WebhookEndpointWithSecret(WebhookEndpoint):
    signing_secret: str
    """`whsec_<base64>`: shown at create and rotate only. Verify deliveries with
    `client.webhooks.unwrap(body, headers, secret=...)`."""


class DeletedWebhookEndpoint(BaseModel):
    id: str
    deleted: bool
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"


class WebhookEndpointTestResult(BaseModel):
    event_type: str
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    status_code: int
    """The HTTP status the endpoint answered the sample event with."""
    success: Literal[True] = True
    """Always true once the endpoint answered; `status_code` says how."""
    webhook_endpoint_id: str


class WebhookEventTypeList(BaseModel):
    data: list[str]
    """The event types this service sends."""
    object: Literal["list"] = "list"


class WebhookAttempt(BaseModel):
    attempt: int
    """1 for the first POST of the delivery."""
    started_at: float
    """Unix seconds when the POST started."""
    duration_ms: int
    status_code: int | None = None
    """The endpoint's answer; null when it gave none (see `error`)."""
    error: str | None = None
    """`http_status` (a non-2xx answer), `timeout` or `connection_error`; null when delivered."""
    next_attempt_at: float | None = None
    """When the next attempt is due after this one; null after the last."""


class WebhookDelivery(BaseModel):
    id: str
    """`whdel_` followed by 24 hex characters."""
    object: Literal["gridline.webhook_delivery"] = "gridline.webhook_delivery"
    event_id: str
    """The event's id: the payload's `id` and the `webhook-id` header, the same on every attempt."""
    event_type: str
    data_id: str
    """The job's or batch's id the event is about."""
    status: Literal["pending", "delivered", "failed"]
    """`failed`: no 2xx answer within the retry window (24 h by default)."""
    created_at: int
    attempts: int
    next_attempt_at: float | None = None
    """When the next attempt is due (pending only)."""
    finished_at: float | None = None
    attempt_log: list[WebhookAttempt]
