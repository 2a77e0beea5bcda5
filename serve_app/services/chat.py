"""Online chat completions (`POST /v1/chat/completions`, issue 27): the checks before any work, the
call to the base's online deployment (online/deployment.py), and the usage the answer is charged.

Checks, in this order, all before anything generates (a refusal starts nothing and charges nothing):
1. the body: `stream` and `stream_options` are this route's own; every other field goes through a
   batch line's own body check (pipelines/_batch_input.py `check_body`), so this route takes what a
   batch line takes and refuses what it refuses, by the same codes, `param` without `body.`;
2. the model, resolved as a batch line's (jobs/model_names.py): a base, or one of the caller's own
   ft: models or kept checkpoints. Unknown, another account's or deleted: 404 `model_not_found`
   (the database's word at this request: a model deleted a moment ago is gone); not servable, or
   its base not served online here (`online_bases`): 400 `model_not_available`;
3. the account's generation bucket: 429 `rate_limit_exceeded` with Retry-After;
4. the prompt, rendered by the trainer's template code and counted with the base's tokenizer:
   the prompt and max_tokens past the base's context are 400 `context_length_exceeded`;
5. with billing on, the credit: the request's most (prompt + max_tokens at the base's online rate,
   `prices.online_usd_per_mtok`) must be available, else 429 `insufficient_quota`;
6. one of the account's generation slots, held while it generates (the router holds it):
   429 `rate_limit_exceeded` with Retry-After.
With billing on, the answer's prompt and completion tokens are charged when it ends, also when the
client left mid-stream (the tokens generated until then; storage/billing.py `charge_online`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from jobs.model_names import resolve_model
from jobs.transitions import lock_account
from online.protocol import Delta, OnlineRequest
from openft.errors import InsufficientQuota, InvalidRequest, NotFound, ServiceError
from openft.ids import new_id
from pipelines._batch_input import BodyRefused, LineError, check_body
from serve_app import rate_limits
from serve_app.schemas.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    CompletionUsage,
    Choice,
    ChoiceDelta,
    ChunkChoice,
)
from serve_app.state import AppState
from storage import billing
from storage.models import Account

_STREAM_FIELDS = ("stream", "stream_options")
_RENDER_LOCK = threading.Lock()  # a fast tokenizer must not encode on two threads at once


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check: what to run, where, and how to answer."""

    model: str  # as the request named it, and as the answer names it
    base_id: str
    adapter_prefix: str  # Serve's multiplexed model id: the adapter's store prefix; "" for the base
    request: OnlineRequest
    stream: bool
    include_usage: bool
    completion_id: str
    created: int


# A batch line's refusal says where in a file; this route's says it of the request.
_AS_REQUEST = (("body.", ""), (" in batches here", " here"), (" in batches", " here"), ("fix the line", "fix the request"),
               ("upload the file again", "send the request again"))  # fmt: skip


def _refusal(error: LineError) -> ServiceError:
    """A batch line's refusal as this route answers it: the body's fields named as top-level ones."""
    message = re.sub(r"^line \d+[,:] ", "", error.message)
    for batch_words, request_words in _AS_REQUEST:
        message = message.replace(batch_words, request_words)
    param = error.param.removeprefix("body.") if error.param else None
    if error.status_code == 404:
        return NotFound(message, param=param, code=error.code)
    return InvalidRequest(message, code=error.code, param=param)


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false.", code="invalid_value", param="stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise InvalidRequest("stream_options is only allowed with stream: true.", code="invalid_value",
                             param="stream_options")
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object.", code="invalid_value", param="stream_options")
    for key in options:
        if key != "include_usage":
            shown = key if key.isidentifier() and len(key) <= 64 else "a field"
            raise InvalidRequest(f"stream_options.{shown} is not supported here; remove it.", code="unsupported_field",
                                 param=f"stream_options.{shown}")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidRequest("stream_options.include_usage must be true or false.", code="invalid_value",
                             param="stream_options.include_usage")
    return True, include


def prepare(state: AppState, account: Account, body: dict) -> Prepared:
    """Checks 1 to 5 of the module docstring (blocking: the database and the tokenizer)."""
    from catalog.bases import get_base
    from catalog.model_source import parse_model_source
    from pipelines.generate import prompt_for
    from pipelines.tokenize import cached_tokenizer

    settings = state.settings
    stream, include_usage = _stream_options(body)
    try:
        asked = check_body({k: v for k, v in body.items() if k not in _STREAM_FIELDS})
    except BodyRefused as refused:
        raise _refusal(refused.error) from None
    with state.db.session() as session:
        resolved = resolve_model(session, account.id, asked.model)
        if resolved is None:
            raise NotFound("The model does not exist or you do not have access to it: name a base or one of your "
                           "ft: models or checkpoints.", param="model", code="model_not_found")
        if not resolved.servable:
            raise InvalidRequest(f"This model cannot answer prompts: {resolved.reason or 'it is not servable.'}",
                                 code="model_not_available", param="model")
        if resolved.base_id not in state.online:
            raise InvalidRequest(f"{resolved.base_id} and its fine-tunes are not served online here; run them in a "
                                 "batch, or ask the operator to list the base in OPENFT_ONLINE_BASES.",
                                 code="model_not_available", param="model")  # fmt: skip
        refusal = rate_limits.take(session, settings, account.id, rate_limits.GENERATIONS)
    if refusal is not None:
        raise refusal
    base = get_base(resolved.base_id)
    tokenizer = cached_tokenizer(base.id, parse_model_source(settings.model_source), str(settings.model_cache_dir))
    try:
        with _RENDER_LOCK:
            ids, max_tokens = prompt_for(asked.messages, asked.max_tokens, tokenizer, base)
    except InvalidRequest as exc:
        raise _refusal(LineError(exc.status, exc.code, exc.message, exc.param)) from None
    if settings.billing_enabled:
        rate = settings.prices.online_usd_per_mtok(base.id)
        need = billing.online_most_cents(len(ids) + max_tokens, rate)
        with state.db.session() as session:
            available = billing.credit(session, account.id).available_cents
        if available < need:
            raise InsufficientQuota(
                f"Not enough credit for this request: its prompt and max_tokens can cost up to {billing.to_usd(need):.2f} "
                f"USD and {billing.to_usd(max(available, 0)):.2f} USD is available. Add credit, or lower max_tokens.",
                code="insufficient_quota")  # fmt: skip
    request = OnlineRequest(tuple(ids), max_tokens, asked.temperature, asked.top_p, asked.seed, asked.stop)
    return Prepared(asked.model, base.id, resolved.adapter_prefix or "", request, stream, include_usage,
                    new_id("chatcmpl-", 24), state.now())


async def deltas(state: AppState, prepared: Prepared) -> AsyncIterator[Delta]:
    """The answer's pieces from the base's online deployment (Serve routes by adapter)."""
    handle = state.online[prepared.base_id].options(stream=True, multiplexed_model_id=prepared.adapter_prefix)
    async for delta in handle.generate.remote(prepared.request):
        yield delta


@contextlib.asynccontextmanager
async def generating(state: AppState, account: Account, prepared: Prepared) -> AsyncIterator[list[int]]:
    """Check 6: one of the account's generation slots, held while the body generates; then the
    charge of the [prompt, completion] tokens the body reported, however it ended."""
    usage = [0, 0]
    async with rate_limits.generation_slot(state, account.id):
        try:
            yield usage
        finally:
            # Shielded: a client that left still pays for what was generated for it.
            await asyncio.shield(asyncio.to_thread(charge, state, account, prepared, *usage))


def charge(state: AppState, account: Account, prepared: Prepared, prompt_tokens: int, completion_tokens: int) -> None:
    """With billing on, the tokens of one answer at the base's online rate (blocking)."""
    if not state.settings.billing_enabled or prompt_tokens + completion_tokens == 0:
        return
    with state.db.session() as session:
        lock_account(session, account.id)
        billing.charge_online(session, account.id, prepared.base_id, prompt_tokens=prompt_tokens,
                              completion_tokens=completion_tokens,
                              usd_per_mtok=state.settings.prices.online_usd_per_mtok(prepared.base_id), now=state.now())


def _usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                           total_tokens=prompt_tokens + completion_tokens)


async def answer(state: AppState, prepared: Prepared, usage: list[int]) -> ChatCompletion:
    """The whole answer as one ChatCompletion. `usage` receives [prompt, completion] tokens as they
    are known, for the charge after it, however it ends."""
    texts, last = [], None
    async for delta in deltas(state, prepared):
        texts.append(delta.text)
        usage[:] = [delta.prompt_tokens, delta.completion_tokens]
        last = delta
    message = ChatCompletionMessage(content="".join(texts))
    return ChatCompletion(id=prepared.completion_id, created=prepared.created, model=prepared.model,
                          choices=[Choice(message=message, finish_reason=last.finish_reason)],
                          usage=_usage(last.prompt_tokens, last.completion_tokens))


def _chunk(prepared: Prepared, delta: ChoiceDelta | None = None, finish_reason: str | None = None,
           usage: CompletionUsage | None = None) -> ChatCompletionChunk:
    choices = [] if delta is None else [ChunkChoice(delta=delta, finish_reason=finish_reason)]
    return ChatCompletionChunk(id=prepared.completion_id, created=prepared.created, model=prepared.model,
                               choices=choices, usage=usage)


async def stream_chunks(state: AppState, prepared: Prepared, usage: list[int]) -> AsyncIterator[list[ChatCompletionChunk]]:
    """The answer as OpenAI's chunks: the role (and empty content) first, then the text as it comes,
    then the finish reason, then with `include_usage` a chunk of usage alone. `usage` as `answer`'s.
    Yielded in the groups that go out together: the role with the first text, each later piece of
    text alone, the finish reason with the last text and the usage. Each group is one write on every
    hop to the client (the replica, the API, Serve's proxy), and a write costs more than its bytes."""
    group = [_chunk(prepared, ChoiceDelta(role="assistant", content=""))]
    async for delta in deltas(state, prepared):
        usage[:] = [delta.prompt_tokens, delta.completion_tokens]
        if delta.text:
            group.append(_chunk(prepared, ChoiceDelta(content=delta.text)))
        if delta.finish_reason is not None:
            group.append(_chunk(prepared, ChoiceDelta(), finish_reason=delta.finish_reason))
            if prepared.include_usage:
                group.append(_chunk(prepared, usage=_usage(*usage)))
        if group:
            yield group
            group = []
