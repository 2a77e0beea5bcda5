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
    # Whether the same request could succeed if sent again unchanged. The official SDKs retry 408,
    # 409, 429 and 5xx twice unless the response says `x-should-retry: false`, so a refusal a retry
    # cannot fix (a limit, an invalid request, a conflict) says so (`retry_headers`).
    retryable: bool = True

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None, **extra: Any):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.extra = extra
        self.headers: dict[str, str] = {}

    def retry_headers(self) -> dict[str, str]:
        """The refusal's own headers, plus `x-should-retry: false` when a retry cannot help."""
        return self.headers if self.retryable else {**self.headers, "x-should-retry": "false"}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}}


class InvalidRequest(ServiceError):
    status = 400
    type = "invalid_request_error"
    retryable = False


class Unauthorized(ServiceError):
    status = 401
    type = "invalid_request_error"
    retryable = False


class NotFound(ServiceError):
    status = 404
    type = "invalid_request_error"
    retryable = False

    def __init__(self, message: str, *, param: str | None = None, code: str = "not_found"):
        super().__init__(message, code=code, param=param)


class InsufficientQuota(ServiceError):
    """429 `insufficient_quota` (OpenAI's type and code): the credit cannot fund the request; adding
    credit, not retrying, cures it."""

    status = 429
    type = "insufficient_quota"
    retryable = False


class Conflict(ServiceError):
    status = 409
    type = "invalid_request_error"
    retryable = False


class RequestTimeout(ServiceError):
    """408: the client stopped sending its request body, or sent it too slowly."""

    status = 408
    type = "invalid_request_error"


class PayloadTooLarge(ServiceError):
    status = 413
    type = "invalid_request_error"
    retryable = False


class HeadTooLarge(ServiceError):
    """431: more header fields, or longer ones, than the server reads (serve_app/request_head.py)."""

    status = 431
    type = "invalid_request_error"
    retryable = False


class UriTooLong(HeadTooLarge):
    """414: a request line longer than the server reads."""

    status = 414


class RangeNotSatisfiable(ServiceError):
    """416 for a download's Range of which no byte is in the file, saying why, with the file's size in
    Content-Range."""

    status = 416
    type = "invalid_request_error"
    retryable = False

    def __init__(self, size: int, message: str):
        super().__init__(message, code="range_not_satisfiable", param="range")
        self.headers = {"content-range": f"bytes */{size}"}


class RateLimited(ServiceError):
    """429, with the effective limit and current use in `error.limit` where there is one, and
    `Retry-After` (whole seconds, rounded up; `retry-after-ms` for the openai SDK) where known."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, limit: float | None = None, current: float | None = None,
                 code: str = "limit_exceeded", param: str | None = None, retry_after: float | None = None):
        extra = {} if limit is None else {"limit": {"limit": limit, "current": current}}
        super().__init__(message, code=code, param=param, **extra)
        # A rate or a slot frees up after Retry-After; a cap (open jobs, files, merges a day) does not.
        self.retryable = retry_after is not None
        if retry_after is not None:
            self.headers = {"Retry-After": str(max(1, math.ceil(retry_after))),
                            "retry-after-ms": str(max(1, math.ceil(retry_after * 1000)))}


# Naming the refused field is the reference's rule, but a name is the caller's data: echoed in
# `message` and `param`, a 50 MB key made a 100 MB error. Names up to this length are echoed;
# longer ones (no parameter of this API is that long) are refused without it.
ECHOED_NAME_CHARS = 64


def unknown_parameter(key: str, parent: str | None = None) -> InvalidRequest:
    """`400 unknown_parameter` for `key` in the object at dotted path `parent` (None: the body).
    A key longer than ECHOED_NAME_CHARS is not echoed: `param` is then `parent` (a path of our
    own names), or null at the top level."""
    if len(key) > ECHOED_NAME_CHARS:
        where = parent or "The request body"
        return InvalidRequest(
            f"{where} has a parameter name longer than {ECHOED_NAME_CHARS} characters; no parameter of this API is "
            "that long: remove it.",
            code="unknown_parameter", param=parent,
        )
    param = f"{parent}.{key}" if parent else key
    return InvalidRequest(f"{param} is not a parameter of this API; remove it.", code="unknown_parameter", param=param)


# -- a run's failures ------------------------------------------------------------------------------
# The reference's job error codes that training itself (tokenization included) can produce.
ERROR_CODES = (
    "invalid_row",
    "template_mismatch",
    "context_too_long",
    "time_limit_exceeded",
    "platform_interrupted",
    "adapter_too_large",
    "training_failed",
    "grader_failed",  # reinforcement: the grader failed on every sample of a step (train/rft.py)
)


class TrainingError(Exception):
    """A failure the job records as `error = {code, message}`; the message never holds row content."""

    def __init__(self, code: str, message: str):
        if code not in ERROR_CODES:
            raise ValueError(f"TrainingError code {code!r} is not one of: {', '.join(ERROR_CODES)}")
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self):
        return (TrainingError, (self.code, self.message))
