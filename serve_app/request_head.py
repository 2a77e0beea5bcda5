"""Bounds on a request's head (issue 24): how many header fields, how long one field, and how long
the request line and every field together may be, refused in OpenAI's envelope before any work.

Where the bytes are read: Ray Serve's HTTP proxy runs uvicorn, which parses with httptools
(llhttp) when it is installed, as `ray[serve]` installs it; that parser has no limit on a header's
size or count, so a 16 MiB `Authorization` header or 2,000 headers were read in full, then copied
into the ASGI scope and over Ray to a replica, before the 401. The limits are enforced in two
places, with the same rule (`HeadLimits`):
- in the proxy, while the head is parsed (entrypoints/serve_proxy.py): the refusal is sent as
  soon as a limit is passed and the connection closed, so the rest of an oversized head is never
  read;
- in the app (`HeadLimit`, outermost ASGI middleware): the guard for a proxy started without that
  hook (a cluster joined at RAY_ADDRESS whose head lacks it; a plain uvicorn). It runs before
  routing, authentication or the database, but the head has then been read.

Refusals: the request line (method, target, version) longer than a field may be: `414
uri_too_long`; more fields than `http_max_headers`: `431 too_many_headers`; one field (name and
value) over `http_max_header_field_bytes`: `431 header_too_large`, `param` the field's name when it
is one a client would send (`authorization`); the line and fields together over
`http_max_header_bytes`: `431 headers_too_large`. Each closes the connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from openft.errors import ECHOED_NAME_CHARS, HeadTooLarge, ServiceError, UriTooLong
from openft.settings import Settings
from serve_app.errors import error_response


@dataclass(frozen=True)
class HeadLimits:
    max_headers: int
    max_field_bytes: int
    max_head_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> HeadLimits:
        return cls(settings.http_max_headers, settings.http_max_header_field_bytes, settings.http_max_header_bytes)

    def line(self, length: int) -> ServiceError | None:
        """The request line's refusal, or None."""
        if length <= self.max_field_bytes:
            return None
        return UriTooLong(f"The request line is longer than {self.max_field_bytes:,} bytes; shorten the URL.",
                          code="uri_too_long", param=None)

    def field(self, number: int, name: bytes, value_length: int, head_length: int) -> ServiceError | None:
        """The refusal of the `number`th field (1 is the first), `head_length` the head's bytes so far
        with it, or None."""
        if number > self.max_headers:
            return HeadTooLarge(f"The request has more than {self.max_headers} header fields; send fewer.",
                                code="too_many_headers", param=None)
        if len(name) + value_length > self.max_field_bytes:
            return HeadTooLarge(f"A header field is longer than {self.max_field_bytes:,} bytes; shorten it.",
                                code="header_too_large", param=_param(name))
        return self.total(head_length)

    def total(self, head_length: int) -> ServiceError | None:
        if head_length <= self.max_head_bytes:
            return None
        return HeadTooLarge(f"The request's header fields are longer than {self.max_head_bytes:,} bytes in all; send "
                            "fewer or shorter ones.", code="headers_too_large", param=None)

    def check(self, line_length: int, fields: Iterable[tuple[bytes, bytes]]) -> ServiceError | None:
        """The whole head's refusal, or None (the app's check; the proxy's applies the same field by field)."""
        refusal, total = self.line(line_length), line_length
        for number, (name, value) in enumerate(fields, start=1):
            if refusal is not None:
                break
            total += len(name) + len(value) + 4  # ": " and CRLF
            refusal = self.field(number, name, len(value), total)
        return refusal


def _param(name: bytes) -> str | None:
    """The field's name for `param` when it is a plain token, else None (it is the caller's data)."""
    text = name.decode("latin-1").lower()
    ok = 0 < len(text) <= ECHOED_NAME_CHARS and all(c.isalnum() or c in "-_" for c in text)
    return text if ok else None


def raw_response(refusal: ServiceError) -> bytes:
    """The refusal as HTTP/1.1 bytes, for the proxy's parser, which answers before any ASGI app runs."""
    body = orjson.dumps(refusal.body())
    reason = {400: b"Bad Request", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}.get(refusal.status, b"")
    head = [b"HTTP/1.1 %d %s" % (refusal.status, reason), b"content-type: application/json",
            b"content-length: %d" % len(body), b"x-should-retry: false", b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _line_length(scope: Scope) -> int:
    """The request line as the client sent it: method, target (path and query) and version."""
    target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string") or b"")
    return len(scope["method"]) + target + 1 + 10  # "?" and " HTTP/1.1" with its spaces, at most


class HeadLimit:
    """ASGI middleware: the app's own check of the head (see the module docstring)."""

    def __init__(self, app: ASGIApp, limits: HeadLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.limits.check(_line_length(scope), scope.get("headers", ()))
            if refusal is not None:
                await error_response(refusal, {"connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)
