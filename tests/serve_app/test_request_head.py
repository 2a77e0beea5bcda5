"""Bounded request heads (issue 24): the rule (serve_app/request_head.py), the Ray Serve proxy that
enforces it while it parses (entrypoints/serve_proxy.py), through the real proxy with raw sockets,
and the app's own check behind a proxy that does not. A 16 MiB `Authorization` header is refused
before the proxy has read it, and 2,000 headers at the 101st; each refusal is OpenAI's envelope."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from openft.settings import Settings
from serve_app.request_body import declared_length
from serve_app.request_params import BEYOND
from serve_app.request_head import HeadLimits
from tests.fuzz.conftest import serve_in_thread
from tests.utils.raw_http import exchange, head

pytestmark = pytest.mark.usefixtures("ray_cluster")
LIMITS = HeadLimits.of(Settings.model_construct())
HUGE = 16 << 20


@pytest.mark.parametrize("line, fields, status, code, param", [
    (20, [(b"authorization", b"Bearer " + b"k" * 50)], None, None, None),
    (20, [(b"x-h%d" % i, b"v") for i in range(100)], None, None, None),
    (20, [(b"x-h%d" % i, b"v") for i in range(101)], 431, "too_many_headers", None),
    (20, [(b"Authorization", b"k" * 8200)], 431, "header_too_large", "authorization"),
    (20, [(b"x-\xff\x00weird", b"k" * 8200)], 431, "header_too_large", None),  # a name not echoed
    (20, [(b"x-a%d" % i, b"k" * 7000) for i in range(5)], 431, "headers_too_large", None),
    (8193, [], 414, "uri_too_long", None),
])
def test_the_rule(line, fields, status, code, param):
    refusal = LIMITS.check(line, fields)
    if status is None:
        assert refusal is None
    else:
        assert (refusal.status, refusal.code, refusal.param) == (status, code, param)


@pytest.mark.parametrize("value, number", [
    (None, None), ("12", 12), (b"0007", 7), ("-1", None), ("1e3", None), ("\u0661\u0662", None), ("", None),
    ("9" * 19, BEYOND), ("9" * 5000, BEYOND),
])
def test_a_content_length_is_bounded_before_it_is_converted(value, number):
    assert declared_length(value) == number


@pytest.fixture(scope="module")
def proxy(apis):
    """(the Serve proxy's port, the API's path prefix)."""
    api = apis("sqlite")
    parts = urlsplit(api.base_url)
    return parts.port, parts.path


def _refused(answer, status: int, code: str, param: str | None = None) -> None:
    assert answer.status == status, (answer.status, answer.body[:200])
    assert answer.headers["content-type"] == "application/json" and answer.headers["connection"] == "close"
    error = answer.error()
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")


def test_the_proxy_refuses_a_16_mib_header_before_reading_it(proxy):
    port, prefix = proxy
    request = head(f"{prefix}/files", [("Authorization", "Bearer " + "k" * HUGE)])
    answer = exchange(port, request)
    _refused(answer, 431, "headers_too_large")
    # The answer came while the client was still writing: what it wrote is what the kernel's socket
    # buffers took before the proxy stopped reading, far from the 16 MiB.
    assert answer.sent < HUGE // 2, answer.sent
    print(f"\n16 MiB Authorization through the Serve proxy: 431 after the client wrote {answer.sent:,} bytes, "
          f"{answer.seconds * 1000:.0f} ms")


def test_the_proxy_refuses_2000_headers_and_each_oversized_part(proxy):
    port, prefix = proxy
    many = exchange(port, head(f"{prefix}/files", [(f"X-H{i}", "v") for i in range(2000)]))
    _refused(many, 431, "too_many_headers")
    print(f"\n2,000 headers through the Serve proxy: 431 in {many.seconds * 1000:.0f} ms")
    _refused(exchange(port, head(f"{prefix}/files", [("Cookie", "c" * 9000)])), 431, "header_too_large", "cookie")
    _refused(exchange(port, head(f"{prefix}/files?after=" + "a" * 9000)), 414, "uri_too_long")
    _refused(exchange(port, b"GET / HTTP/1.1\r\nNo colon here\r\n\r\n"), 400, "invalid_request")


def test_heads_within_the_limits_are_served_on_one_connection(proxy, apis):
    port, prefix = proxy
    _, key = apis("sqlite").create_account()
    fields = [("Authorization", f"Bearer {key}"), *[(f"X-H{i}", "v" * 100) for i in range(90)]]
    request = head(f"{prefix}/files", fields)
    answer = exchange(port, request[:-2] + b"Connection: close\r\n\r\n")
    assert answer.status == 200, answer.body[:200]


def test_the_app_refuses_the_same_behind_a_proxy_that_does_not(tmp_path):
    """Plain uvicorn (no bounded protocol) in front: the app's own check refuses after the read."""
    settings = Settings(data_dir=tmp_path, model_source="standin", http_max_headers=20)
    with serve_in_thread(settings) as (base_url, _state):
        port = urlsplit(base_url).port
        _refused(exchange(port, head("/v1/files", [("Authorization", "Bearer " + "k" * HUGE)])),
                 431, "header_too_large", "authorization")
        _refused(exchange(port, head("/v1/files", [(f"X-H{i}", "v") for i in range(21)])), 431, "too_many_headers")
