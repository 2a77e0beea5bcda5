"""JSON request bodies: parsed with orjson, refused in OpenAI's envelope when not an object."""

from __future__ import annotations

import orjson
from fastapi import Request

from openft.errors import InvalidRequest


async def json_object(request: Request) -> dict:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.", code="invalid_json", param=None) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json", param=None)
    return body
