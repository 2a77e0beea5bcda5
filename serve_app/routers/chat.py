"""HTTP route of chat completions (`POST /v1/chat/completions`): one JSON ChatCompletion, or with
`stream: true` server-sent events (`data: <chunk>` each, then `data: [DONE]`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from openft.errors import ServiceError
from serve_app.auth import current_account
from serve_app.request_body import json_object
from serve_app.schemas.chat import ChatCompletion, ChatCompletionChunk
from serve_app.services import chat as service
from storage.models import Account

router = APIRouter(prefix="/chat", tags=["chat"])
log = logging.getLogger("openft.api")
_DONE = b"data: [DONE]\n\n"
_SERVER_ERROR = {"message": "The server had an error while generating the answer.", "type": "server_error",
                 "param": None, "code": "server_error"}  # fmt: skip


@router.post("/completions", response_model=ChatCompletion)
async def create_chat_completion(request: Request, account: Account = Depends(current_account)):
    state = request.app.state.openft
    body = await json_object(request)
    prepared = await run_in_threadpool(service.prepare, state, account, body)
    if not prepared.stream:
        async with service.generating(state, account, prepared) as usage:
            return await service.answer(state, prepared, usage)
    # The slot is taken before the response starts, so that a refusal is still a 429.
    stack = contextlib.AsyncExitStack()
    usage = await stack.enter_async_context(service.generating(state, account, prepared))
    return StreamingResponse(_events(service.stream_chunks(state, prepared, usage), stack),
                             media_type="text/event-stream", headers={"cache-control": "no-cache"})


async def _events(groups: AsyncIterator[list[ChatCompletionChunk]], stack: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    """Each group of chunks as one write of server-sent events; [DONE] goes with the last group."""
    async with stack:
        try:
            async for group in groups:
                yield b"".join(b"data: " + chunk.model_dump_json().encode() + b"\n\n" for chunk in group) + (
                    _DONE if any(c.choices and c.choices[0].finish_reason for c in group) else b"")
        except ServiceError as exc:
            yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
        except Exception as exc:  # the status is sent already: the SDK raises APIError on an error event
            log.error("chat completion stream failed: %s", type(exc).__name__)
            yield b"data: " + orjson.dumps({"error": _SERVER_ERROR}) + b"\n\n"
