"""Webhook repository: endpoints (the owner's rows only), the delivery outbox with its claim
lease, and the attempts log. What an event says and when a delivery is retried is webhooks/'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from storage.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


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
    return _newest_first(session, query, WebhookEndpoint, cursor, limit)


def _newest_first(session: Session, query, model, cursor, limit: int) -> tuple[Sequence, bool]:
    """A page of `query` newest first (created_ns, then id), after the row `cursor` when given."""
    if cursor is not None:
        query = query.where((model.created_ns < cursor.created_ns)
                            | ((model.created_ns == cursor.created_ns) & (model.id < cursor.id)))
    rows = session.scalars(query.order_by(model.created_ns.desc(), model.id.desc()).limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit


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
    """Lease up to `limit` pending deliveries whose time has come and that no live lease holds.

    Compare-and-set: the UPDATE repeats the conditions, so of two deliverers racing for a row one
    updates it and the other's UPDATE (on PostgreSQL it waits for the first's commit, then
    re-reads the row) matches nothing. SKIP LOCKED lets the second pick other rows meanwhile."""
    free = or_(WebhookDelivery.lease_owner.is_(None), WebhookDelivery.lease_expires_at < now)
    due = (WebhookDelivery.status == "pending") & (WebhookDelivery.next_attempt_at <= now) & free
    ids = session.scalars(select(WebhookDelivery.id).where(due)
                          .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
                          .limit(limit).with_for_update(skip_locked=True)).all()
    claimed = []
    for delivery_id in ids:
        done = session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id, due).values(
            lease_owner=owner, lease_expires_at=now + lease_s, attempts=WebhookDelivery.attempts + 1))
        if done.rowcount == 1:
            claimed.append(delivery_id)
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
    lease is no longer the caller's (it lapsed and another deliverer took the delivery)."""
    done = session.execute(update(WebhookDelivery).where(
        WebhookDelivery.id == due.delivery_id, WebhookDelivery.lease_owner == owner,
        WebhookDelivery.attempts == due.attempt).values(
        status=status, next_attempt_at=next_attempt_at, lease_owner=None, lease_expires_at=None,
        last_status_code=status_code, last_error=error, finished_at=now if status != "pending" else None))
    if done.rowcount != 1:
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
    page, has_more = _newest_first(session, query, WebhookDelivery, cursor, limit)
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
