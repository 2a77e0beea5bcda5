"""Slow request bodies: an ASGI middleware that cuts off a body that stalls or trickles.

A client that sends one byte a second holds its request, and its slot on the replica, for as long
as it likes; five of them took the API down under Serve's default of 5 ongoing requests. The
middleware wraps `receive`: each wait for the next body chunk is bounded by
`body_idle_timeout_seconds`, and once the body has had `body_rate_grace_seconds` of the client's
time it must average `upload_min_bytes_per_second`. Only time spent waiting on the client counts,
so a server busy between chunks (validating, writing to S3) does not count against it. A body cut
off before the response starts gets `408 request_timeout` with `Connection: close`; after, the
connection is closed. Headers are the HTTP server's (Ray Serve's proxy) concern, not this one's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from fastapi import FastAPI

from openft.errors import RequestTimeout
from openft.settings import Settings
from serve_app.errors import error_response

Message = dict[str, Any]


class _BodyCutOff(Exception):
    """Raised into the app from `receive`: not a ServiceError, so no handler drains the body."""


class SlowBodyGuard:
    def __init__(self, app, *, idle_timeout_s: float, min_bytes_per_s: int, grace_s: float):
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.min_bytes_per_s = min_bytes_per_s
        self.grace_s = grace_s

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[Message]], send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(self, receive)
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if body.cut_off is not None:
                return  # the app's answer to the cut-off body (its own error) is replaced below
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, body.receive, guarded_send)
        except _BodyCutOff:
            pass
        if body.cut_off is None:
            return
        if started:
            # Too late for a status: end the response short, which closes the connection.
            raise RuntimeError("request body timed out after the response started")
        error = RequestTimeout(body.cut_off, code="request_timeout")
        await error_response(error, {"connection": "close"})(scope, receive, send)


class _Body:
    """The request's `receive`, with the clock on the client."""

    def __init__(self, guard: SlowBodyGuard, receive: Callable[[], Awaitable[Message]]):
        self.guard = guard
        self._receive = receive
        self.received = 0
        self.waited = 0.0  # seconds spent waiting for the client's bytes
        self.done = False
        self.cut_off: str | None = None

    def _allowed_wait(self) -> tuple[float, str]:
        g = self.guard
        wait, why = g.idle_timeout_s, f"The request body sent nothing for {g.idle_timeout_s:g} s."
        if g.min_bytes_per_s:
            # The longest the body may have waited, in all, at its current size and the minimum rate.
            budget = max(g.grace_s, self.received / g.min_bytes_per_s) - self.waited
            if budget < wait:
                wait, why = budget, f"The request body arrived slower than {g.min_bytes_per_s} bytes per second."
        return wait, why

    async def receive(self) -> Message:
        if self.cut_off is not None:
            raise _BodyCutOff()
        if self.done:
            return await self._receive()  # after the body: a wait for the disconnect, unbounded
        wait, why = self._allowed_wait()
        started = time.monotonic()
        try:
            if wait <= 0:
                raise TimeoutError
            message = await asyncio.wait_for(self._receive(), wait)
        except TimeoutError:
            self.cut_off = why
            raise _BodyCutOff() from None
        finally:
            self.waited += time.monotonic() - started
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.done = not message.get("more_body", False)
        else:
            self.done = True  # http.disconnect
        return message


def install_slow_body_guard(app: FastAPI, settings: Settings) -> None:
    app.add_middleware(
        SlowBodyGuard,
        idle_timeout_s=settings.body_idle_timeout_seconds,
        min_bytes_per_s=settings.upload_min_bytes_per_second,
        grace_s=settings.body_rate_grace_seconds,
    )
