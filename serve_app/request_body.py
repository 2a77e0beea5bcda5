"""Request bodies: every route's maximum, enforced before the app reads a byte, and JSON bodies
parsed with orjson and refused in OpenAI's envelope when not an object.

`BodyLimit` is the one place the maxima are enforced, for the routes that read the body
themselves (`json_object`) and for those whose pydantic body model FastAPI reads (the admin
API) alike. It sits in front of the router: it picks the route's limit from `BODY_LIMITS`,
refuses a `Content-Length` above it before reading anything, else reads the body (chunked or
not) message by message and stops as soon as it passes the limit: `413 request_too_large`,
`param` null, the limit in the message, and `Connection: close`, so the server stops reading the
rest instead of draining it. A body within the limit is handed on whole; the JSON routes read
their bodies whole anyway, so this costs no memory they did not already use.

The check runs before authentication: an anonymous caller can make the app hold at most one
route's limit, never more. FastAPI's own `max_body_size` is not used: its 413 is plain text, not
OpenAI's envelope, whenever the response starts before the body is read (a 401, any GET), and a
route cannot opt out of an app-wide default, as the streamed upload must. A new route that
streams its body must be named in `BODY_LIMITS` with None.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson
from fastapi import Request
from fastapi.routing import iter_route_contexts
from starlette._utils import get_route_path  # the router's own rule for a path under root_path
from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openft.errors import ECHOED_NAME_CHARS, InvalidRequest, PayloadTooLarge
from serve_app.errors import error_response
from serve_app.request_params import bounded_count

KIB, MIB = 1024, 1024 * 1024
DEFAULT_BODY_LIMIT = 64 * KIB
# The maximum body of each route, by route name (the handler's name); every route not named here
# takes DEFAULT_BODY_LIMIT (64 KiB: distill options, the admin API's credits and limits, and the
# bodiless POSTs the SDK sends as `{}`). None: the route streams its body through a reader that
# bounds it itself.
BODY_LIMITS: dict[str, int | None] = {
    # model, files, method, hyperparameters, 16 metadata pairs of 64 + 512 characters: a real body
    # is a few KiB; 1 MiB leaves room without letting a create hold much.
    "create_fine_tuning_job": 1 * MIB,
    # multipart uploads, bounded part by part by serve_app/multipart_stream.py
    "create_file": None,
    # a python grader's source may be 256 KiB (graders/validate.py), and a run carries its item too;
    # an eval holds several graders
    "validate_grader": 2 * MIB,
    "run_grader": 2 * MIB,
    "create_eval": 4 * MIB,
    # a run's items may come in the body (file_content, up to evals/source.py MAX_ITEMS); larger
    # sources go as a file of purpose evals (data_source.source.id)
    "create_eval_run": 16 * MIB,
    # the messages of a whole context (8,192 tokens of several bytes each, JSON-escaped) with room
    "create_chat_completion": 1 * MIB,
}


def limit_of(route_name: str) -> int | None:
    return BODY_LIMITS.get(route_name, DEFAULT_BODY_LIMIT)


def route_limits(routes: Sequence[BaseRoute]) -> list[tuple[re.Pattern, frozenset[str], int | None]]:
    """(path regex, methods, limit) of every route, in the router's order."""
    table = []
    for route in iter_route_contexts(routes):
        if route.path is not None:
            regex, _, _ = compile_path(route.path)
            table.append((regex, frozenset(route.methods or ()), limit_of(route.name or "")))
    return table


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than {limit:,} bytes, the limit of this route; send a smaller body.",
        code="request_too_large",
        param=None,
    )


def declared_length(value: str | bytes | None) -> int | None:
    """A Content-Length's number (request_params.bounded_count: past every limit when too long);
    None when there is none or it is not one (the HTTP server refuses those before the app; if one
    did not, the body's bytes are counted instead)."""
    if value is None:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
    if not text.isascii() or not text.isdigit():
        return None
    return bounded_count(text)


def _declared_length(scope: Scope) -> int | None:
    return declared_length(next((v for n, v in scope.get("headers", ()) if n == b"content-length"), None))


class BodyLimit:
    """ASGI middleware: each route's body limit (see the module docstring). Starlette builds the
    middleware stack on the first request, after every route is included, so the table is whole."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]):
        self.app = app
        self.table = route_limits(routes)

    def limit(self, scope: Scope) -> int | None:
        """The limit of the route `scope` goes to; DEFAULT_BODY_LIMIT where none matches (a 404 or 405)."""
        path = get_route_path(scope)
        for regex, methods, limit in self.table:
            if scope["method"] in methods and regex.match(path):
                return limit
        return DEFAULT_BODY_LIMIT

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit(scope) if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(limit, scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(limit, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    @staticmethod
    async def _refuse(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(_too_large(limit), headers={"connection": "close"})(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the buffered body once, then what the server sends (a disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def json_object(request: Request) -> dict:
    """The body as a JSON object; `BodyLimit` has already bounded it."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.", code="invalid_json", param=None) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json", param=None)
    path = _nul_path(body, ())
    if path is not None:
        # PostgreSQL cannot compare or store text holding NUL (a 500 before this), and no id, name,
        # suffix or metadata value of this API has one.
        param = ".".join(path) if path and all(len(p) <= ECHOED_NAME_CHARS for p in path) else None
        raise InvalidRequest("Strings in the request body must not contain NUL characters.", code="invalid_value",
                             param=param)
    return body


def _nul_path(value, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The path of the first string (key or value) holding a NUL character, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                return path
            found = _nul_path(item, (*path, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _nul_path(item, (*path, str(i)))
            if found is not None:
                return found
    return None
