"""The one mapper from exceptions to OpenAI's error envelope.

Validation errors are built from `exc.errors()` (field paths and fixed messages), never from
`str(exc)`, which would echo the submitted values.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from openft.errors import ECHOED_NAME_CHARS, ServiceError, unknown_parameter

log = logging.getLogger("openft.api")


def _envelope(status: int, message: str, *, type_: str, code: str | None, param: str | None) -> JSONResponse:
    # An invalid body, an unknown route or method: the same request fails the same way again.
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers={"x-should-retry": "false"} if status < 500 else None)


def error_response(exc: ServiceError, headers: dict[str, str] | None = None) -> JSONResponse:
    """A service error as its HTTP response (also for ASGI middleware, which runs outside the handlers),
    with its own headers (Retry-After, `x-should-retry: false`: openft/errors.py) and `headers`."""
    return JSONResponse(exc.body(), status_code=exc.status, headers={**exc.retry_headers(), **(headers or {})})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        # A refusal may carry headers of its own (Connection: close after an unread body, Retry-After).
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        if first.get("type") == "extra_forbidden" and loc:  # a pydantic body model's unknown field
            return error_response(unknown_parameter(loc[-1], ".".join(loc[:-1]) or None))
        # A path can hold the caller's own names (the keys of a dict field): cut it before a long one.
        long = next((i for i, part in enumerate(loc) if len(part) > ECHOED_NAME_CHARS), len(loc))
        param = ".".join(loc[:long]) or None
        return _envelope(
            400, f"Invalid value for {param or 'the request'}: {first.get('msg')}.",
            type_="invalid_request_error", code="invalid_value", param=param,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        message = "Unknown route." if exc.status_code == 404 else str(exc.detail)
        return _envelope(exc.status_code, message, type_="invalid_request_error", code=code, param=None)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # Log the class only: an exception's text can carry user data.
        log.exception("unhandled %s", type(exc).__name__)
        return _envelope(500, "The server had an error processing the request.", type_="server_error",
                         code="server_error", param=None)
