"""The service's error family and its OpenAI envelope.

Services raise these; one FastAPI handler renders `{"error": {message, type, param, code}}`
so that the official SDK raises its typed exceptions (`BadRequestError`, `NotFoundError`, ...).
Messages never echo user data: line numbers, field names and codes only.
"""

from __future__ import annotations

import math
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
        self.headers: dict[str, str] = {}

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


class PayloadTooLarge(ServiceError):
    status = 413
    type = "invalid_request_error"


class RateLimited(ServiceError):
    """429, with the effective limit and current use in `error.limit` where there is one, and
    `Retry-After` (whole seconds, rounded up; `retry-after-ms` for the openai SDK) where known."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, limit: float | None = None, current: float | None = None,
                 code: str = "limit_exceeded", param: str | None = None, retry_after: float | None = None):
        extra = {} if limit is None else {"limit": {"limit": limit, "current": current}}
        super().__init__(message, code=code, param=param, **extra)
        if retry_after is not None:
            self.headers = {"Retry-After": str(max(1, math.ceil(retry_after))),
                            "retry-after-ms": str(max(1, math.ceil(retry_after * 1000)))}
