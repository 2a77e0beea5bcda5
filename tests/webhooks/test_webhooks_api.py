"""Webhook endpoints through the official SDK against the deployed API (SQLite and PostgreSQL):
`client.webhooks.create/list/retrieve/update/delete/rotate_secret/test` and
`webhooks.event_types.list` parse in the SDK; `test` reaches a real receiver that verifies it with
`client.webhooks.unwrap`; a rotated secret makes the old one fail; every refusal answers its status,
code and param and creates nothing; another account's endpoint is 404 everywhere."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import free_port
from webhooks.events import EVENT_TYPES

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def clients(api):
    _, key = api.create_account()
    _, other = api.create_account()
    return api.client(key), api.client(other), key


def test_endpoints_through_the_sdk_test_event_and_rotation(clients, receivers):
    client, other, _ = clients
    receiver = receivers()
    made = client.webhooks.create(name="jobs", url=receiver.url, event_types=["fine_tuning.job.succeeded",
                                                                              "batch.completed"])
    assert made.object == "webhook_endpoint" and made.id.startswith("wh_") and made.signing_secret.startswith("whsec_")
    assert made.signing_secret_hint == "whsec_..." + made.signing_secret[-4:] and made.updated_at == made.created_at
    assert made.event_types == ["fine_tuning.job.succeeded", "batch.completed"]
    got = client.webhooks.retrieve(made.id)
    assert "signing_secret" not in got.model_dump() and got.url == receiver.url and got.name == "jobs"
    assert [e.id for e in client.webhooks.list()] == [made.id] and list(other.webhooks.list()) == []

    same = client.webhooks.update(made.id, name="jobs")  # no change: updated_at stays
    assert same.updated_at == made.updated_at
    changed = client.webhooks.update(made.id, event_types=["fine_tuning.job.failed"], name="failures")
    assert (changed.event_types, changed.name, changed.url) == (["fine_tuning.job.failed"], "failures", receiver.url)

    receiver.secret = made.signing_secret
    result = client.webhooks.test(made.id, event_type="fine_tuning.job.failed")
    assert (result.object, result.status_code, result.success, result.webhook_endpoint_id) == (
        "webhook_endpoint.test", 200, True, made.id)
    [sample] = receiver.events()
    assert sample.error is None and type(sample.event).__name__ == "FineTuningJobFailedWebhookEvent"
    assert sample.headers["webhook-id"] == sample.event.id and sample.event.id.startswith("evt_")

    rotated = client.webhooks.rotate_secret(made.id)
    assert rotated.signing_secret != made.signing_secret and rotated.signing_secret_hint != made.signing_secret_hint
    client.webhooks.test(made.id, event_type="batch.completed")
    assert receiver.wait_for(2)[1].error == "InvalidWebhookSignatureError"  # the old secret no longer verifies
    receiver.secret = rotated.signing_secret
    client.webhooks.test(made.id, event_type="batch.completed")
    assert type(receiver.wait_for(3)[2].event).__name__ == "BatchCompletedWebhookEvent"
    kept = client.webhooks.rotate_secret(made.id, keep_old_secret_active_for_24_hours=True)
    client.webhooks.test(made.id, event_type="batch.completed")  # signed by both for 24 h: either verifies
    assert receiver.wait_for(4)[3].error is None and len(receiver.events()[3].headers["webhook-signature"].split()) == 2
    receiver.secret = kept.signing_secret
    client.webhooks.test(made.id, event_type="batch.completed")
    assert receiver.wait_for(5)[4].error is None

    receiver.answers.append(500)
    assert client.webhooks.test(made.id, event_type="batch.failed").status_code == 500
    assert client.webhooks.event_types.list().data == list(EVENT_TYPES)
    gone = client.webhooks.delete(made.id)
    assert (gone.id, gone.deleted, gone.object) == (made.id, True, "webhook_endpoint.deleted")
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(made.id)


def refused(call, status: int, code: str, param: str | None):
    with pytest.raises(openai.APIStatusError) as info:
        call()
    error = info.value.body
    assert (info.value.status_code, error["code"], error["param"]) == (status, code, param), error


@pytest.mark.parametrize("url", ["ftp://example.com/x", "javascript:alert(1)", "https://", "example.com/hook",
                                 "https://user:pw@example.com/hook", "https://example.com/a#frag",
                                 "https://example.com:99999/", "https://exa mple.com/", "x" * 3000])
def test_a_url_that_is_not_plain_http_or_https_is_refused_and_nothing_created(clients, url):
    client, _, _ = clients
    refused(lambda: client.webhooks.create(name="n", url=url, event_types=["batch.completed"]), 400, "invalid_url", "url")
    assert list(client.webhooks.list()) == []


def test_every_other_refusal_names_its_param_and_creates_nothing(clients, api):
    client, other, key = clients
    ok = dict(name="n", url="https://example.com/hook", event_types=["batch.completed"])
    cases = [
        ({**ok, "event_types": ["response.completed"]}, "unsupported_value", "event_types"),
        ({**ok, "event_types": ["response.completed", "batch.completed"]}, "unsupported_value", "event_types"),
        ({**ok, "event_types": []}, "invalid_value", "event_types"),
        ({**ok, "event_types": "batch.completed"}, "invalid_value", "event_types"),
        ({**ok, "name": ""}, "invalid_value", "name"),
        ({k: v for k, v in ok.items() if k != "name"}, "missing_required_parameter", "name"),
        ({k: v for k, v in ok.items() if k != "url"}, "missing_required_parameter", "url"),
        ({k: v for k, v in ok.items() if k != "event_types"}, "missing_required_parameter", "event_types"),
        ({**ok, "secret": "mine"}, "unknown_parameter", "secret"),
    ]
    http = httpx.Client(base_url=api.base_url, headers={"authorization": f"Bearer {key}"}, timeout=30)
    for body, code, param in cases:
        answer = http.post("/webhook_endpoints", json=body)
        assert answer.status_code == 400 and (answer.json()["error"]["code"], answer.json()["error"]["param"]) == (
            code, param), (body, answer.text)
    assert list(client.webhooks.list()) == []

    made = client.webhooks.create(**ok)
    refused(lambda: client.webhooks.update(made.id, url="file:///etc/passwd"), 400, "invalid_url", "url")
    refused(lambda: client.webhooks.update(made.id, event_types=["video.completed"]), 400, "unsupported_value",
            "event_types")
    refused(lambda: client.webhooks.test(made.id, event_type="response.failed"), 400, "unsupported_value", "event_type")
    assert client.webhooks.retrieve(made.id).model_dump() == client.webhooks.list().data[0].model_dump()
    assert client.webhooks.retrieve(made.id).url == ok["url"]
    # the endpoint does not answer: 502, and x-should-retry false so the SDK does not resend the test
    client.webhooks.update(made.id, url=f"http://127.0.0.1:{free_port()}/hooks")
    refused(lambda: client.webhooks.test(made.id, event_type="batch.completed"), 502, "endpoint_unreachable",
            "webhook_endpoint_id")

    for call in (lambda: other.webhooks.retrieve(made.id), lambda: other.webhooks.update(made.id, name="x"),
                 lambda: other.webhooks.delete(made.id), lambda: other.webhooks.rotate_secret(made.id),
                 lambda: other.webhooks.test(made.id, event_type="batch.completed"),
                 lambda: other.get(f"/gridline/webhook_endpoints/{made.id}/deliveries", cast_to=object)):
        refused(call, 404, "not_found", "webhook_endpoint_id")
    assert client.webhooks.retrieve(made.id).name == "n" and list(other.webhooks.list()) == []


def test_the_endpoint_limit_is_checked_under_the_accounts_lock(clients, api):
    client, _, _ = clients
    limit = api.settings.webhook_endpoints_per_account
    for i in range(limit):
        client.webhooks.create(name=f"e{i}", url=f"https://example.com/{i}", event_types=["batch.failed"])
    with pytest.raises(openai.RateLimitError) as info:
        client.webhooks.create(name="one more", url="https://example.com/x", event_types=["batch.failed"])
    assert info.value.body["code"] == "limit_exceeded" and info.value.body["limit"] == {"limit": limit, "current": limit}
    page = client.webhooks.list(limit=7)
    assert len(page.data) == 7 and page.has_more
    assert len(list(client.webhooks.list(limit=7))) == limit  # the SDK's auto-paging follows `after`
