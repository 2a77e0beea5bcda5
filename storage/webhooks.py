"""Webhook repository: endpoints (the owner's rows only), the delivery outbox with its claim
lease (storage/leases.py, `DELIVERY`), and the attempts log. What an event says and when a
delivery is retried is webhooks/'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from storage import leases, paging
from storage.leases import Kind
from storage.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

# A deliverer's claim on a delivery. No attempt count ends it (the retry window does:
# webhooks/delivery.py), and a lapsed lease is taken over at the next claim: losing one changes
# nothing but who tries next.
DELIVERY = Kind("delivery", WebhookDelivery, "w", max_attempts=None, exhausted_code=None)


# -- endpoints ------------------------------------------------------------------------------------
def get_endpoint(session: Session, account_id: str, endpoint_id: str) -> WebhookEndpoint | None:
    return session.scalar(select(WebhookEndpoint).where(
        WebhookEndpoint.id == endpoint_id, WebhookEndpoint.account_id == account_id))


def count_endpoints(session: Session, account_id: str) -> int:
    return session.scalar(select(func.count()).select_from(WebhookEndpoint).where(
        WebhookEndpoint.account_id == account_id))


def list_endpoints(session: Session, account_id: str, *, limit: int,
                   after: str | None) -> tuple[Sequence[WebhookEndpoint], bool]:
    """Newest first; `after` is the id of the last endpoint of the previous page."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.account_id == account_id)
    cursor = get_endpoint(session, account_id, after) if after else None
    return paging.page(session, query, WebhookEndpoint, cursor, limit)


def subscribed(session: Session, account_id: str, event_type: str) -> list[WebhookEndpoint]:
    """The account's endpoints that asked for `event_type` (an account has a few: filtered here, not in SQL,
    since JSON containment differs between SQLite and PostgreSQL)."""
    rows = session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.account_id == account_id)
                           .order_by(WebhookEndpoint.created_ns)).all()
    return [row for row in rows if event_type in row.event_types]


def delete_endpoint(session: Session, endpoint: WebhookEndpoint) -> None:
    """The endpoint with its deliveries and their log, deleted here rather than left to ON DELETE
    CASCADE, so that it does not hang on a connection's foreign-key setting (SQLite's is per connection)."""
    ids = select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == endpoint.id)
    session.execute(delete(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids)))
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)


def signing_keys(endpoint: WebhookEndpoint, now: float) -> tuple[str, ...]:
    """The secrets that sign a POST sent now, as stored (sealed: webhooks/secrets.py opens them): the
    current one, and the previous one while a rotation keeps it."""
    if endpoint.previous_secret and (endpoint.previous_secret_until or 0) > now:
        return endpoint.secret, endpoint.previous_secret
    return (endpoint.secret,)


def endpoints_with_plain_secrets(session: Session) -> Sequence[WebhookEndpoint]:
    """Endpoints whose secret, or previous secret, was stored before secrets were sealed (0012)."""
    plain = "whsec\\_%"  # the secret's own prefix; a sealed one starts `enc1:`
    return session.scalars(select(WebhookEndpoint).where(or_(WebhookEndpoint.secret.like(plain, escape="\\"),
                                                             WebhookEndpoint.previous_secret.like(plain, escape="\\")))).all()


# -- the outbox -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Due:
    """A claimed delivery, with what its POST needs (read with the claim, so the current URL and secrets sign it)."""

    delivery_id: str
    attempt: int
    event_id: str
    payload: str
    url: str
    secrets: tuple[str, ...]
    created_at: float


def claim_due(session: Session, now: float, *, owner: str, lease_s: float, limit: int) -> list[Due]:
    """Lease up to `limit` pending deliveries whose time has come and that no live lease holds
    (a compare-and-set per row: storage/leases.py `claim_many`)."""
    due = ((WebhookDelivery.status == "pending") & (WebhookDelivery.next_attempt_at <= now)
           & leases.claimable(DELIVERY, now))
    claimed = leases.claim_many(session, DELIVERY, due, (WebhookDelivery.next_attempt_at, WebhookDelivery.id), limit,
                                owner, now, lease_s)
    if not claimed:
        return []
    rows = session.execute(select(WebhookDelivery, WebhookEndpoint)
                           .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
                           .where(WebhookDelivery.id.in_(claimed))).all()
    return [Due(delivery.id, delivery.attempts, delivery.event_id, delivery.payload, endpoint.url,
                signing_keys(endpoint, now), delivery.created_at) for delivery, endpoint in rows]


def record_attempt(session: Session, due: Due, owner: str, *, started_at: float, duration_ms: int,
                   status_code: int | None, error: str | None, status: str, next_attempt_at: float | None,
                   now: float) -> bool:
    """Close the caller's claim on `due` with what its attempt got; False (nothing written) when the
    lease is no longer the caller's (it lapsed and another deliverer, or this one again, took the delivery)."""
    recorded = leases.write_owned(
        session, WebhookDelivery, due.delivery_id, owner, WebhookDelivery.attempts == due.attempt, **leases.RELEASED,
        status=status, next_attempt_at=next_attempt_at, last_status_code=status_code, last_error=error,
        finished_at=now if status != "pending" else None)
    if not recorded:
        return False
    session.add(WebhookAttempt(delivery_id=due.delivery_id, attempt=due.attempt, started_at=started_at,
                               duration_ms=duration_ms, status_code=status_code, error=error,
                               next_attempt_at=next_attempt_at))
    return True


def list_deliveries(session: Session, endpoint_id: str, *, limit: int,
                    after: str | None) -> tuple[list[tuple[WebhookDelivery, list[WebhookAttempt]]], bool]:
    """An endpoint's deliveries, newest first, each with its attempts in order (the caller checked the owner)."""
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
    cursor = session.scalar(query.where(WebhookDelivery.id == after)) if after else None
    page, has_more = paging.page(session, query, WebhookDelivery, cursor, limit)
    attempts: dict[str, list[WebhookAttempt]] = {row.id: [] for row in page}
    if page:
        for attempt in session.scalars(select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(list(attempts)))
                                       .order_by(WebhookAttempt.delivery_id, WebhookAttempt.attempt)):
            attempts[attempt.delivery_id].append(attempt)
    return [(row, attempts[row.id]) for row in page], has_more


def delete_ended_before(session: Session, cutoff: float, *, limit: int) -> int:
    """Delete up to `limit` deliveries (with their attempts) that ended, delivered or failed, before `cutoff`."""
    ids = list(session.scalars(select(WebhookDelivery.id).where(
        WebhookDelivery.status != "pending", WebhookDelivery.finished_at < cutoff).limit(limit)))
    if ids:
        session.execute(delete(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids)))
        session.execute(delete(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
    return len(ids)
