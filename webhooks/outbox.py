"""The outbox: an event owed to each endpoint that asked for it, written in the caller's
transaction (the one that ends the job or batch: jobs/transitions.py `finish`,
batches/transitions.py `_end`), so an end that commits has its deliveries and one that rolls back
has none; a process that dies after the commit loses nothing, since the deliverer reads the rows."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from openft.ids import new_id
from storage import webhooks as repo
from storage.models import WebhookDelivery
from webhooks import events


def enqueue(session: Session, account_id: str, event_type: str, object_id: str, now: float) -> list[str]:
    """One delivery per endpoint of `account_id` subscribed to `event_type`, all under one event id;
    returns the delivery ids. Only the account's own endpoints: another account's never see it."""
    endpoints = repo.subscribed(session, account_id, event_type)
    if not endpoints:
        return []
    event_id = events.event_id()
    body = events.payload(event_id, event_type, int(now), object_id)
    ids = []
    for endpoint in endpoints:
        delivery = WebhookDelivery(
            id=new_id("whdel_", 24), endpoint_id=endpoint.id, account_id=account_id, event_id=event_id,
            event_type=event_type, payload=body, status="pending", attempts=0, created_at=float(now),
            created_ns=time.time_ns(), next_attempt_at=float(now))
        session.add(delivery)
        ids.append(delivery.id)
    return ids
