"""The service's error family and its OpenAI envelope.

Services raise these; one FastAPI handler renders `{"error": {message, type, param, code}}`
so that the official SDK raises its typed exceptions (`BadRequestError`, `NotFoundError`, ...).
Messages never echo user data: line numbers, field names and codes only.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status: int = 500
    type: str = "server_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None, **extra: Any):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}}


class InvalidRequest(ServiceError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ServiceError):
    status = 401
    type = "invalid_request_error"


class NotFound(ServiceError):
    status = 404
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message, code="not_found", param=param)


class Conflict(ServiceError):
    status = 409
    type = "invalid_request_error"


class RequestTimeout(ServiceError):
    """408: the client stopped sending its request body, or sent it too slowly."""

    status = 408
    type = "invalid_request_error"


class PayloadTooLarge(ServiceError):
    status = 413
    type = "invalid_request_error"


class RateLimited(ServiceError):
    """429 with the effective limit and current use in `error.limit`."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, limit: float, current: float, code: str = "limit_exceeded", param: str | None = None):
        super().__init__(message, code=code, param=param, limit={"limit": limit, "current": current})
