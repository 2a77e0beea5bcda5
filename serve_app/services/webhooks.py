"""Webhook endpoints: create (every refusal), list, retrieve, update, delete, rotate_secret, test;
the event types; the owner's delivery log.

Refusals come before anything is written: the body's fields (OpenAI's: name, url, event_types),
the URL (http or https, a host, no credentials or fragment, no IP literal or localhost that the
address rule refuses: webhooks/targets.py), the event types (those this service sends:
webhooks/events.py), then the per-account endpoint limit, checked under the account's lock with
the insert. An endpoint is visible to its account only; another's answers 404. The secret is in
the answers of create and rotate_secret only, as OpenAI does, and stored sealed
(webhooks/secrets.py).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from openft.errors import Conflict, InvalidRequest, NotFound, RateLimited, ServiceError, unknown_parameter
from openft.ids import new_id
from serve_app.schemas.common import Page
from serve_app.schemas.webhooks import (
    DeletedWebhookEndpoint,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)
from serve_app.services.paging import check_limit, page_of
from serve_app.state import AppState
from storage import webhooks as repo
from storage.leases import lock_account
from storage.models import Account
from storage.models import WebhookEndpoint as EndpointRow
from webhooks import events, signing, targets
from webhooks.delivery import post
from webhooks.secrets import SecretBox, SecretUnreadable

NAME_CHARS, URL_CHARS = 256, 2048
KEEP_OLD_SECRET_S = 24 * 3600


class EndpointUnreachable(ServiceError):
    """`test` got no answer from the endpoint (a timeout, a refused connection)."""

    status = 502
    type = "invalid_request_error"
    retryable = False


def endpoint_object(row: EndpointRow, secret: str | None) -> WebhookEndpoint:
    return WebhookEndpoint(id=row.id, created_at=row.created_at, event_types=list(row.event_types), name=row.name,
                           signing_secret_hint=signing.hint(secret) if secret else None, url=row.url,
                           updated_at=row.updated_at)


def _shown(state: AppState, row: EndpointRow) -> WebhookEndpoint:
    """The endpoint as lists show it; no hint when its secret no longer opens (signing_secret changed)."""
    try:
        return endpoint_object(row, SecretBox(state.settings).open(row.secret))
    except SecretUnreadable:
        return endpoint_object(row, None)


def _with_secret(row: EndpointRow, secret: str) -> WebhookEndpointWithSecret:
    return WebhookEndpointWithSecret(**endpoint_object(row, secret).model_dump(), signing_secret=secret)


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def _check_keys(body: dict, allowed: tuple[str, ...]) -> None:
    for key in body:
        if key not in allowed:
            raise unknown_parameter(key)


def _name(value) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > NAME_CHARS:
        raise _invalid(f"name must be a non-empty string of at most {NAME_CHARS} characters.", "name")
    return value


def _url(value, allowed) -> str:
    """An absolute http(s) URL with a host that is not a refused address as written. Messages never
    echo it (it is the caller's data)."""
    if not isinstance(value, str) or len(value) > URL_CHARS:
        raise _invalid(f"url must be a string of at most {URL_CHARS} characters.", "url", "invalid_url")
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        parts, port_ok = None, False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise _invalid("url must be an http:// or https:// URL with a host, e.g. https://example.com/webhooks.",
                       "url", "invalid_url")
    if parts.username is not None or parts.password is not None or parts.fragment or any(c.isspace() for c in value):
        raise _invalid("url must not hold credentials, a #fragment or whitespace: sign-in data would be stored "
                       "and shown in the endpoint; verify the signature instead.", "url", "invalid_url")
    for address in targets.literal_addresses(parts.hostname):
        if (why := targets.refusal(address, allowed)) is not None:
            raise _invalid(targets.refused_message(why), "url", "invalid_url")
    return value


def _event_types(value) -> list[str]:
    supported = ", ".join(events.EVENT_TYPES)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _invalid(f"event_types must be a non-empty list of event types: {supported}.", "event_types")
    for i, event_type in enumerate(value):
        if event_type not in events.EVENT_TYPES:
            raise _invalid(f"event_types[{i}] is not an event this service sends; it sends {supported}.",
                           "event_types", "unsupported_value")
    return list(dict.fromkeys(value))


def _required(body: dict, key: str):
    if body.get(key) is None:
        raise _invalid(f"Missing {key}.", key, "missing_required_parameter")
    return body[key]


def create_endpoint(state: AppState, account: Account, body: dict) -> WebhookEndpointWithSecret:
    _check_keys(body, ("name", "url", "event_types"))
    name, url = _name(_required(body, "name")), _url(_required(body, "url"), state.settings.webhook_allowed_networks)
    event_types = _event_types(_required(body, "event_types"))
    limit = state.settings.webhook_endpoints_per_account
    now = state.now()
    with state.db.session() as session:
        lock_account(session, account.id)  # two creates at the limit cannot both pass
        current = repo.count_endpoints(session, account.id)
        if current >= limit:
            raise RateLimited(f"This account has {current} webhook endpoints, the most it may have ({limit}); "
                              "delete one first.", limit=limit, current=current, param=None)
        secret = signing.new_secret()
        row = EndpointRow(id=new_id("wh_", 24), account_id=account.id, name=name, url=url, event_types=event_types,
                          secret=SecretBox(state.settings).seal(secret), created_at=now, created_ns=time.time_ns(),
                          updated_at=now)
        session.add(row)
        session.flush()
        return _with_secret(row, secret)


def _owned(session, account: Account, endpoint_id: str) -> EndpointRow:
    row = repo.get_endpoint(session, account.id, endpoint_id)
    if row is None:
        raise NotFound("No such webhook endpoint.", param="webhook_endpoint_id")
    return row


def retrieve_endpoint(state: AppState, account: Account, endpoint_id: str) -> WebhookEndpoint:
    with state.db.session() as session:
        return _shown(state, _owned(session, account, endpoint_id))


def list_endpoints(state: AppState, account: Account, *, limit: int, after: str | None) -> Page[WebhookEndpoint]:
    check_limit(limit, 100)
    with state.db.session() as session:
        rows, has_more = repo.list_endpoints(session, account.id, limit=limit, after=after)
        data = [_shown(state, r) for r in rows]
    return page_of(data, has_more)


def update_endpoint(state: AppState, account: Account, endpoint_id: str, body: dict) -> WebhookEndpoint:
    with state.db.session() as session:
        row = _owned(session, account, endpoint_id)  # another account's answers 404 before the body is read
        _check_keys(body, ("name", "url", "event_types"))
        changes = {}
        if body.get("name") is not None:
            changes["name"] = _name(body["name"])
        if body.get("url") is not None:
            changes["url"] = _url(body["url"], state.settings.webhook_allowed_networks)
        if body.get("event_types") is not None:
            changes["event_types"] = _event_types(body["event_types"])
        changed = {k: v for k, v in changes.items() if getattr(row, k) != v}
        for key, value in changed.items():
            setattr(row, key, value)
        if changed:
            row.updated_at = state.now()
        return _shown(state, row)


def delete_endpoint(state: AppState, account: Account, endpoint_id: str) -> DeletedWebhookEndpoint:
    """The endpoint, its pending deliveries (never sent now) and its delivery log."""
    with state.db.session() as session:
        repo.delete_endpoint(session, _owned(session, account, endpoint_id))
    return DeletedWebhookEndpoint(id=endpoint_id, deleted=True)


def rotate_secret(state: AppState, account: Account, endpoint_id: str, body: dict) -> WebhookEndpointWithSecret:
    """A new secret signs every delivery from now on, retries of earlier events included. With
    keep_old_secret_active_for_24_hours, deliveries carry a second signature by the old secret for 24 h."""
    with state.db.session() as session:
        row = _owned(session, account, endpoint_id)
        _check_keys(body, ("keep_old_secret_active_for_24_hours",))
        keep = body.get("keep_old_secret_active_for_24_hours", False)
        if not isinstance(keep, bool):
            raise _invalid("keep_old_secret_active_for_24_hours must be true or false.",
                           "keep_old_secret_active_for_24_hours")
        now, secret, box = state.now(), signing.new_secret(), SecretBox(state.settings)
        keep = keep and _opens(box, row.secret)  # an unreadable old secret could sign nothing
        row.previous_secret, row.previous_secret_until = (row.secret, now + KEEP_OLD_SECRET_S) if keep else (None, None)
        row.secret, row.updated_at = box.seal(secret), now
        return _with_secret(row, secret)


def _opens(box: SecretBox, stored: str) -> bool:
    try:
        box.open(stored)
    except SecretUnreadable:
        return False
    return True


def send_test_event(state: AppState, account: Account, endpoint_id: str, body: dict) -> WebhookEndpointTestResult:
    """POST a sample event (a fresh event id, `data.id` naming no object) signed as a delivery is,
    under a delivery's deadline and address rule, and answer the status the endpoint gave. Nothing
    is queued or retried."""
    with state.db.session() as session:
        row = _owned(session, account, endpoint_id)
        _check_keys(body, ("event_type",))
        event_type = _required(body, "event_type")
        if event_type not in events.EVENT_TYPES:
            raise _invalid(f"event_type must be one of {', '.join(events.EVENT_TYPES)}.", "event_type",
                           "unsupported_value")
        try:
            url, keys = row.url, SecretBox(state.settings).open_all(repo.signing_keys(row, time.time()))
        except SecretUnreadable:
            raise Conflict("This endpoint's signing secret no longer opens with the service's signing key (the "
                           "operator changed it); give it a new one with rotate_secret.", code="secret_unreadable",
                           param="webhook_endpoint_id") from None
    event_id = events.event_id()
    body_text = events.payload(event_id, event_type, state.now(), events.SAMPLE_IDS[event_type])
    answer = post(url, keys, event_id, body_text, deadline_s=state.settings.webhook_timeout_seconds,
                  allowed=state.settings.webhook_allowed_networks)
    if answer.error == "address_refused":
        raise _invalid(targets.refused_message(answer.refused), "url", "invalid_url")
    if answer.status_code is None:
        raise EndpointUnreachable(f"The endpoint did not answer the test event ({answer.error}); check that the URL "
                                  "is reachable from this service.", code="endpoint_unreachable",
                                  param="webhook_endpoint_id")
    return WebhookEndpointTestResult(event_type=event_type, status_code=answer.status_code,
                                     webhook_endpoint_id=endpoint_id)


def event_types() -> WebhookEventTypeList:
    return WebhookEventTypeList(data=list(events.EVENT_TYPES))


def list_deliveries(state: AppState, account: Account, endpoint_id: str, *, limit: int,
                    after: str | None) -> Page[WebhookDelivery]:
    check_limit(limit, 100)
    with state.db.session() as session:
        _owned(session, account, endpoint_id)
        rows, has_more = repo.list_deliveries(session, endpoint_id, limit=limit, after=after)
        data = [WebhookDelivery(
            id=d.id, event_id=d.event_id, event_type=d.event_type, data_id=events.object_id(d.payload),
            status=d.status, created_at=int(d.created_at), attempts=d.attempts, next_attempt_at=d.next_attempt_at,
            finished_at=d.finished_at,
            attempt_log=[WebhookAttempt(attempt=a.attempt, started_at=a.started_at, duration_ms=a.duration_ms,
                                        status_code=a.status_code, error=a.error, next_attempt_at=a.next_attempt_at)
                         for a in attempts]) for d, attempts in rows]
    return page_of(data, has_more)
