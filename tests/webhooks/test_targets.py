"""Which addresses a webhook may reach (webhooks/targets.py), and where it is checked.

No test here opens a connection to any address but 127.0.0.1: the rule is tested as a pure
function over addresses; a name's lookup is answered at the resolver's seam (`socket.getaddrinfo`)
with the addresses a hostile DNS would give, and refused before any connection; end to end, only a
receiver on 127.0.0.1 is used, refused by default and reached once the setting allows it."""

from __future__ import annotations

import socket
from ipaddress import ip_address, ip_network

import pytest
from sqlalchemy import func, select

from openft.errors import InvalidRequest
from openft.settings import Settings
from serve_app.services import webhooks as service
from storage.db import Database
from storage.models import WebhookAttempt, WebhookEndpoint
from tests.conftest import LOOPBACK_RECEIVERS
from tests.webhooks.test_delivery import Hooks
from webhooks import outbox, targets
from webhooks.delivery import deliver_due

REFUSED = [
    ("127.0.0.1", "a loopback address"), ("127.8.9.10", "a loopback address"), ("::1", "a loopback address"),
    ("10.0.0.1", "a private address"), ("172.16.5.4", "a private address"), ("192.168.1.1", "a private address"),
    ("fd12:3456::1", "a private address"), ("169.254.1.1", "a link-local address"), ("fe80::1%2", "a link-local address"),
    ("224.0.0.251", "a multicast address"), ("ff02::1", "a multicast address"), ("0.0.0.0", "an unspecified address"),
    ("::", "an unspecified address"), ("100.64.0.1", "a reserved address"),
    ("169.254.169.254", "a cloud metadata address"), ("fd00:ec2::254", "a cloud metadata address"),
    ("168.63.129.16", "a cloud metadata address"), ("100.100.100.200", "a cloud metadata address"),
    # IPv6 spellings of IPv4 hosts: mapped, 6to4 and NAT64 reach the same machine
    ("::ffff:127.0.0.1", "a loopback address"), ("::ffff:169.254.169.254", "a cloud metadata address"),
    ("2002:a00:1::1", "a private address"), ("64:ff9b::7f00:1", "a loopback address"),
]


@pytest.mark.parametrize("address, why", REFUSED)
def test_the_rule_refuses_what_is_not_public(address, why):
    assert targets.refusal(ip_address(address)) == why


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_the_rule_lets_public_addresses_through(address):
    assert targets.refusal(ip_address(address)) is None


def test_the_operator_allows_networks_and_nothing_else():
    allowed = [ip_network("10.20.0.0/16"), ip_network("127.0.0.1/32")]
    assert targets.refusal(ip_address("10.20.3.4"), allowed) is None
    assert targets.refusal(ip_address("::ffff:127.0.0.1"), allowed) is None  # the same host, spelled in IPv6
    assert targets.refusal(ip_address("10.21.0.1"), allowed) == "a private address"
    assert targets.refusal(ip_address("127.0.0.2"), allowed) == "a loopback address"
    assert targets.refusal(ip_address("169.254.169.254"), allowed) == "a cloud metadata address"


@pytest.fixture
def default_hooks(tmp_path):  # noqa: D103
    """A SQLite world on the default settings: no network allowed."""
    settings = Settings(data_dir=tmp_path, model_source="standin", webhook_timeout_seconds=5)
    hooks = Hooks(settings, Database(settings.resolved_database_url()))
    yield hooks
    hooks.db.dispose()


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:8080/hooks", "a loopback address"), ("http://localhost/hooks", "a loopback address"),
    ("https://api.localhost/hooks", "a loopback address"), ("http://[::1]:9/hooks", "a loopback address"),
    ("http://10.1.2.3/hooks", "a private address"), ("http://169.254.169.254/latest/meta-data", "a cloud metadata address"),
    ("http://[::ffff:a9fe:a9fe]/", "a cloud metadata address"), ("http://0.0.0.0:80/", "an unspecified address"),
])
def test_create_and_update_refuse_a_refused_address_as_written(default_hooks, url, why):
    a = default_hooks.account()
    with pytest.raises(InvalidRequest) as refused:
        default_hooks.endpoint(a, url)
    assert (refused.value.code, refused.value.param) == ("invalid_url", "url") and why in refused.value.message
    assert url.split("//")[1].split("/")[0] not in refused.value.message  # the caller's URL is not echoed
    made = default_hooks.endpoint(a, "https://hooks.example.com/in")  # a name: checked when it is delivered to
    with pytest.raises(InvalidRequest) as refused:
        service.update_endpoint(default_hooks.state, a, made.id, {"url": url})
    assert (refused.value.code, refused.value.param) == ("invalid_url", "url")
    with default_hooks.db.session() as session:
        assert session.scalar(select(func.count()).select_from(WebhookEndpoint)) == 1
        assert session.get(WebhookEndpoint, made.id).url == "https://hooks.example.com/in"


def _resolver(monkeypatch, answers: dict[str, list[str]]) -> list[str]:
    """`socket.getaddrinfo` answering `answers` for those names (a hostile DNS); returns the names asked."""
    real, asked = socket.getaddrinfo, []

    def lookup(host, port, *args, **kwargs):
        if host in answers:
            asked.append(host)
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                    for a in answers[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return asked


def _deliver_once(hooks: Hooks, account, url: str | None = None) -> WebhookAttempt:
    """Create an endpoint at `url` (unless None: the account's), queue one event, run one round; its attempt."""
    if url is not None:
        hooks.endpoint(account, url, ["batch.completed"])
    with hooks.db.session() as session:
        outbox.enqueue(session, account.id, "batch.completed", "batch_" + "1" * 24, 0.0)
    deliver_due(hooks.db, hooks.settings, "ctl-targets.w")
    with hooks.db.session() as session:
        return session.scalars(select(WebhookAttempt).order_by(WebhookAttempt.seq.desc())).first()


def test_a_name_resolving_to_a_refused_address_is_refused_before_any_connection(tmp_path, monkeypatch, receivers):
    settings = Settings(data_dir=tmp_path, model_source="standin", webhook_timeout_seconds=5, **LOOPBACK_RECEIVERS)
    hooks = Hooks(settings, Database(settings.resolved_database_url()))
    receiver = receivers()
    port = int(receiver.url.split(":")[2].split("/")[0])
    # The first answer is where a connection would go: a private one is refused even with a
    # loopback one after it, and never connected to.
    asked = _resolver(monkeypatch, {"rebind.example.test": ["10.9.8.7", "127.0.0.1"]})
    attempt = _deliver_once(hooks, hooks.account(), f"http://rebind.example.test:{port}/hooks")
    assert (attempt.status_code, attempt.error) == (None, "address_refused") and asked == ["rebind.example.test"]
    assert receiver.events() == []
    hooks.db.dispose()


def test_the_connection_goes_to_the_address_checked_not_to_a_second_lookup(tmp_path, monkeypatch, receivers):
    settings = Settings(data_dir=tmp_path, model_source="standin", webhook_timeout_seconds=5, **LOOPBACK_RECEIVERS)
    hooks = Hooks(settings, Database(settings.resolved_database_url()))
    receiver = receivers()
    port = int(receiver.url.split(":")[2].split("/")[0])
    # Answered once; a second lookup (the HTTP client's own) would fail: the name exists nowhere else.
    asked = _resolver(monkeypatch, {"hooks.example.test": ["127.0.0.1"]})
    attempt = _deliver_once(hooks, hooks.account(), f"http://hooks.example.test:{port}/hooks")
    assert (attempt.status_code, attempt.error) == (200, None) and asked == ["hooks.example.test"]
    [got] = receiver.events()
    assert got.headers["host"] == f"hooks.example.test:{port}"  # the URL's host, sent to the pinned address
    hooks.db.dispose()


def test_loopback_is_refused_by_default_and_reached_once_allowed(tmp_path, receivers):
    """End to end on 127.0.0.1 only: the default refuses it at create, at delivery and in `test`;
    the setting that allows 127.0.0.1/32 lets each reach the receiver."""
    worlds = {}
    for name, extra in (("default", {}), ("allowed", LOOPBACK_RECEIVERS)):  # one database, two settings
        settings = Settings(data_dir=tmp_path, model_source="standin", webhook_timeout_seconds=5, **extra)
        worlds[name] = Hooks(settings, Database(settings.resolved_database_url()))
    default, allowed = worlds["default"], worlds["allowed"]
    receiver = receivers()
    a = default.account()
    with pytest.raises(InvalidRequest) as refused:
        default.endpoint(a, receiver.url)
    assert (refused.value.code, refused.value.param) == ("invalid_url", "url")
    endpoint = allowed.endpoint(a, receiver.url, ["batch.completed"])

    # The operator takes the allowance back: what the endpoint is sent is refused, unsent.
    attempt = _deliver_once(default, a)
    assert (attempt.status_code, attempt.error) == (None, "address_refused")
    with pytest.raises(InvalidRequest) as refused:
        service.send_test_event(default.state, a, endpoint.id, {"event_type": "batch.completed"})
    assert (refused.value.code, refused.value.param) == ("invalid_url", "url")
    assert "a loopback address" in refused.value.message
    assert receiver.events() == []

    assert service.send_test_event(allowed.state, a, endpoint.id, {"event_type": "batch.completed"}).status_code == 200
    attempt = _deliver_once(allowed, a)  # a new event (the refused one waits for its backoff)
    assert (attempt.status_code, attempt.error) == (200, None) and len(receiver.events()) == 2
    for world in worlds.values():
        world.db.dispose()
