"""Continuous batching for online chat completions: the batch engine's decode loop
(pipelines/generate.py `DecodeLoop` over a `TransformersEngine`) driven by one thread, which
requests join between decode steps, with adapters loaded onto the base and unloaded while it runs.
No Ray here: online/deployment.py holds one per Serve replica, and tests drive it in-process.

- `stream(request, adapter)` (async) hands a request to the engine thread and yields its `Delta`s
  as tokens are chosen. The thread takes every request that arrived into the running batch at the
  next step (up to `max_batch_rows`; the rest wait in arrival order), so a request never waits for
  the batch it arrived beside to finish. A client that leaves (the stream closed early) has its row
  taken out of the batch at the next step.
- Adapters: `hold_adapter(name, read_files)` loads one onto the base unless it is resident and
  returns an `AdapterHold`, one reference on it; every request decoding with it holds one more.
  Serve's multiplexing cache keeps the holds and drops the least recently used one
  (`AdapterHold.__del__`, an eviction); the adapter is unloaded, on the engine thread between
  steps, once no hold and no request has it. So an adapter evicted while its requests decode
  stays until they end, and one asked for again before that is held again without a reload.
- Text: each row's tokens are detokenized incrementally (the prefix-offset method: a token's text
  is read in the context of the token before it, and a trailing partial character waits for the
  next token). What a stop string could still cut (its length less one character) is held back;
  the last delta is the rest of the result's own text, so the deltas concatenate to exactly the
  text the batch engine returns for the same tokens.
- Pacing: with `stream_interval` > 0 a row's first text goes out at once (time to first token) and
  later text at most once per interval, what came meanwhile in one delta (the last one, with the
  finish reason, never waits); tokens are detokenized only when a delta may go. Every delta
  crosses two Ray hops and an HTTP write before the client, which cost more CPU than the decode
  step that made it: at 16 clients a delta per token served 24.3 requests a second against 38.7
  paced (bench/online.py). Ray Serve LLM paces its streams the same way
  (`stream_batching_interval_ms`). With `chunks_per_second` > 0 the interval also stretches with
  the replica's open streams, so that together they send at most that many deltas a second: the
  deltas' cost stays a bounded share of the CPU however many clients stream, where a fixed
  interval's grows with each one (the first text still goes at once).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import torch

from online.protocol import Delta, OnlineRequest
from pipelines.generate import DecodeLoop, GenRequest, GenResult, SamplingParams, TransformersEngine

log = logging.getLogger("openft.online")


class EngineFailed(RuntimeError):
    """The engine thread failed a step: every request in its batch fails with this."""


class _Fifo(deque):
    """DecodeLoop's queue in arrival order: it pops the next request from the left."""

    def pop(self):  # noqa: D102 - DecodeLoop's queue protocol
        return self.popleft()


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    adapter: str | None
    holdback: int  # characters a stop string could still cut
    text: str = ""  # the row's text decoded so far
    sent: int = 0  # characters of `text` already sent
    prefix_offset: int = 0
    read_offset: int = 0
    put_at: float | None = None  # when the last delta went out (monotonic)

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the replica's event loop is closing: nobody reads this stream any more
            pass


class AdapterHold:
    """One reference on a resident adapter, kept by Serve's multiplexing cache. Serve calls
    `__del__` when it evicts the adapter (and Python again when it collects the object): the
    reference goes once."""

    def __init__(self, engine: OnlineEngine, name: str):
        self.engine, self.name, self._held = engine, name, True

    def __del__(self):
        if self._held:
            self._held = False
            self.engine._evicted(self.name)


class OnlineEngine:
    def __init__(self, engine: TransformersEngine, *, stream_interval: float = 0.0, chunks_per_second: float = 0.0):
        self.engine, self.stream_interval, self.chunks_per_second = engine, stream_interval, chunks_per_second
        self.loads = self.evictions = self.unloads = 0
        self._keys = itertools.count()
        self._cond = threading.Condition()  # guards the inbox, ops, cancels and streams
        self._inbox: list[GenRequest] = []
        self._ops: list[tuple[Callable[[], None], asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._cancels: set[int] = set()
        self._streams: dict[int, _Stream] = {}
        self._refs: dict[str, int] = {}  # resident adapters: holds + requests decoding with them
        self._idle: set[str] = set()  # adapters whose references reached zero: unload at the next step
        self._stopping = False
        self._loop = self._new_loop()
        self._thread = threading.Thread(target=self._run, name="openft-online-engine", daemon=True)
        self._thread.start()

    # -- the API of a replica ---------------------------------------------------------------
    async def stream(self, request: OnlineRequest, adapter: str | None = None) -> AsyncIterator[Delta]:
        params = SamplingParams(request.max_tokens, request.temperature, request.top_p, request.seed, request.stop)
        key = next(self._keys)
        gen = GenRequest(key, adapter, tuple(request.prompt_ids), params)
        if not gen.prompt_ids or params.max_tokens < 1:
            raise ValueError("a request needs a prompt and max_tokens >= 1")
        queue: asyncio.Queue = asyncio.Queue()
        holdback = max((len(s) for s in request.stop), default=1) - 1
        with self._cond:
            if adapter is not None:
                if adapter not in self._refs:
                    raise ValueError(f"adapter {adapter!r} is not held on this engine")
                self._refs[adapter] += 1
            self._streams[key] = _Stream(asyncio.get_running_loop(), queue, adapter, holdback)
            self._inbox.append(gen)
            self._cond.notify()
        finished = False
        try:
            while not finished:
                items = [await queue.get()]
                while not queue.empty():  # what else is ready goes out as one delta
                    items.append(queue.get_nowait())
                failure = next((i for i in items if isinstance(i, EngineFailed)), None)
                if failure is not None:
                    finished = True
                    raise failure
                last = items[-1]
                finished = last.finish_reason is not None
                yield Delta("".join(i.text for i in items), last.finish_reason, last.prompt_tokens, last.completion_tokens)
        finally:
            if not finished:
                with self._cond:
                    self._cancels.add(key)
                    self._cond.notify()

    async def hold_adapter(self, name: str, read_files: Callable[[], dict[str, bytes]]) -> AdapterHold:
        """A reference on adapter `name`, loaded from `read_files()` (peft files by name) unless resident."""
        with self._cond:
            if name in self._refs:
                self._refs[name] += 1
                self._idle.discard(name)
                return AdapterHold(self, name)
        files = await asyncio.to_thread(read_files)
        await self._on_engine_thread(lambda: self._add(name, files))
        return AdapterHold(self, name)

    def stats(self) -> dict:
        with self._cond:
            return {"loads": self.loads, "evictions": self.evictions, "unloads": self.unloads,
                    "resident": sorted(self._refs), "queued": len(self._inbox) + len(self._loop.queue),
                    "decoding": len(self._loop.rows)}  # fmt: skip

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=30)

    # -- the engine thread --------------------------------------------------------------------
    def _new_loop(self) -> DecodeLoop:
        return DecodeLoop(self.engine, _Fifo(), on_result=self._result, on_token=self._token)

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._inbox or self._ops or self._cancels or self._idle or self._loop.busy or self._stopping):
                        self._cond.wait()
                    if self._stopping:
                        return
                    ops, self._ops = self._ops, []
                    self._loop.queue.extend(self._inbox)
                    self._inbox = []
                    cancels, self._cancels = self._cancels, set()
                for op, loop, future in ops:
                    self._run_op(op, loop, future)
                if cancels:
                    self._cancel(cancels)
                try:
                    if self._loop.busy:
                        self._loop.advance()
                except Exception as exc:  # a failed step fails its batch; the thread serves the next requests
                    log.error("online engine step failed: %s", type(exc).__name__)
                    self._fail_all(EngineFailed(f"The engine failed a decode step ({type(exc).__name__})."))
                self._unload_idle()

    @staticmethod
    def _run_op(op, loop, future) -> None:
        def settle(error: BaseException | None) -> None:
            if not future.done():
                future.set_result(None) if error is None else future.set_exception(error)

        try:
            op()
        except Exception as exc:  # handed to the awaiting loader, which raises it in its request
            loop.call_soon_threadsafe(settle, exc)
        else:
            loop.call_soon_threadsafe(settle, None)

    async def _on_engine_thread(self, op: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            self._ops.append((op, loop, future))
            self._cond.notify()
        await future

    def _add(self, name: str, files: dict[str, bytes]) -> None:
        with self._cond:
            if name in self._refs:  # loaded by an earlier op meanwhile
                self._refs[name] += 1
                self._idle.discard(name)
                return
        self.engine.add_adapter(name, files)
        with self._cond:
            self._refs[name] = 1
            self.loads += 1

    def _evicted(self, name: str) -> None:
        with self._cond:
            self.evictions += 1
            self._unref(name)

    def _unref(self, name: str | None) -> None:
        """Drop a reference (the caller holds `_cond`)."""
        if name is None or name not in self._refs:
            return
        self._refs[name] -= 1
        if self._refs[name] <= 0:
            self._idle.add(name)
            self._cond.notify()

    def _unload_idle(self) -> None:
        with self._cond:
            gone = [n for n in self._idle if self._refs.get(n) == 0]
            for name in gone:
                del self._refs[name]
            # Counted with the resident set's change, under the lock, so that stats() never shows an
            # adapter gone but not yet unloaded; the weights come off next, on this (the engine's) thread,
            # before any later load of the same name can run.
            self.unloads += len(gone)
            self._idle.clear()
        for name in gone:
            self.engine.remove_adapter(name)

    def _cancel(self, keys: set[int]) -> None:
        self._loop.drop(keys)
        kept = [r for r in self._loop.queue if r.key not in keys]
        self._loop.queue.clear()
        self._loop.queue.extend(kept)
        with self._cond:
            for key in keys:
                stream = self._streams.pop(key, None)
                if stream is not None:
                    self._unref(stream.adapter)

    def _fail_all(self, error: EngineFailed) -> None:
        """Fail every request the loop had taken (decoding, waiting, or in the failed admission)."""
        self._loop = self._new_loop()
        with self._cond:
            waiting = {request.key for request in self._inbox}
            for key in [k for k in self._streams if k not in waiting]:
                stream = self._streams.pop(key)
                self._unref(stream.adapter)
                stream.put(error)

    def _token(self, row) -> None:
        stream = self._streams.get(row.request.key)
        if stream is None:
            return
        now = time.monotonic()
        if stream.put_at is not None and now - stream.put_at < self._interval():
            return  # paced: this token is read with the next delta's (the method below takes several at once)
        tokens = row.tokens
        before = self.engine._text(tokens[stream.prefix_offset:stream.read_offset])
        text = self.engine._text(tokens[stream.prefix_offset:])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            stream.text += text[len(before):]
            stream.prefix_offset, stream.read_offset = stream.read_offset, len(tokens)
        safe = len(stream.text) - stream.holdback
        if safe > stream.sent:
            stream.put(Delta(stream.text[stream.sent:safe], None, len(row.request.prompt_ids), len(tokens)))
            stream.sent, stream.put_at = safe, now

    def _interval(self) -> float:
        """The least time between a row's deltas: `stream_interval`, or longer while the replica's
        open streams would together send more than `chunks_per_second`."""
        if not self.chunks_per_second:
            return self.stream_interval
        return max(self.stream_interval, len(self._streams) / self.chunks_per_second)

    def _result(self, result: GenResult) -> None:
        with self._cond:
            stream = self._streams.pop(result.key, None)
            if stream is None:
                return
            self._unref(stream.adapter)
        sent = stream.text[:stream.sent]
        if not result.text.startswith(sent):  # a tokenizer whose pieces decode apart differently
            log.warning("online stream text diverged from the result's text; the rest follows the result")
        stream.put(Delta(result.text[len(sent):], result.finish_reason, result.prompt_tokens, result.completion_tokens))
