"""Webhook signing secrets at rest (webhooks/secrets.py): the database holds them sealed, never as
shown; they still sign (the SDK verifies a delivery); and after the operator changes
`signing_secret` an old one is reported, not a 500: list shows no hint, `test` answers `409
secret_unreadable`, a delivery's attempt records `secret_unreadable`, and rotate_secret mends it."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from openft.errors import Conflict
from openft.settings import Settings
from serve_app.services import webhooks as service
from storage.db import Database
from storage.models import WebhookAttempt, WebhookEndpoint
from tests.conftest import LOOPBACK_RECEIVERS
from tests.webhooks.test_delivery import Hooks
from webhooks import outbox
from webhooks.delivery import deliver_due
from webhooks.secrets import PREFIX


def _world(tmp_path, secret: str) -> Hooks:
    settings = Settings(data_dir=tmp_path, model_source="standin", signing_secret=secret, webhook_timeout_seconds=5,
                        **LOOPBACK_RECEIVERS)
    return Hooks(settings, Database(settings.resolved_database_url()))


def test_a_secret_is_stored_sealed_signs_and_survives_a_changed_key_as_a_refusal(tmp_path, receivers):
    first = _world(tmp_path, "one")
    receiver = receivers()
    a = first.account()
    made = first.endpoint(a, receiver.url, ["batch.completed"])
    receiver.secret = made.signing_secret
    with first.db.session() as session:
        stored = session.get(WebhookEndpoint, made.id).secret
    assert stored.startswith(PREFIX) and made.signing_secret not in stored and made.signing_secret[6:] not in stored
    assert service.send_test_event(first.state, a, made.id, {"event_type": "batch.completed"}).status_code == 200
    assert receiver.events()[0].error is None  # the SDK verified the signature made with the opened secret

    changed = _world(tmp_path, "two")  # the operator changed OPENFT_SIGNING_SECRET
    [listed] = service.list_endpoints(changed.state, a, limit=10, after=None).data
    assert listed.id == made.id and listed.signing_secret_hint is None
    with pytest.raises(Conflict) as refused:
        service.send_test_event(changed.state, a, made.id, {"event_type": "batch.completed"})
    assert (refused.value.status, refused.value.code, refused.value.param) == (409, "secret_unreadable",
                                                                               "webhook_endpoint_id")
    with changed.db.session() as session:
        outbox.enqueue(session, a.id, "batch.completed", "batch_" + "2" * 24, 0.0)
    deliver_due(changed.db, changed.settings, "ctl-secrets.w")
    with changed.db.session() as session:
        [attempt] = session.scalars(select(WebhookAttempt)).all()
    assert (attempt.status_code, attempt.error) == (None, "secret_unreadable") and len(receiver.events()) == 1

    mended = service.rotate_secret(changed.state, a, made.id, {"keep_old_secret_active_for_24_hours": True})
    receiver.secret = mended.signing_secret
    assert service.send_test_event(changed.state, a, made.id, {"event_type": "batch.completed"}).status_code == 200
    assert receiver.events()[1].error is None and len(receiver.events()[1].headers["webhook-signature"].split()) == 1
    for world in (first, changed):
        world.db.dispose()
