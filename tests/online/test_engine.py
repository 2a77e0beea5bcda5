"""The online engine in-process on the qwen2.5 stand-in with random adapters, no Ray: concurrent
streams decode together and each answer equals the batch engine's for the same request, the
streamed pieces concatenate to it (stop strings included), a request joins a running batch,
a closed stream leaves the batch, adapters are loaded, held, evicted and unloaded by count, and a
paced stream (by its interval, or by the replica's chunk budget) sends its first text at once and
the rest in one piece within its interval."""

from __future__ import annotations

import asyncio

import pytest

from catalog.bases import get_base
from online.engine import OnlineEngine
from online.protocol import OnlineRequest
from pipelines.generate import GenRequest, SamplingParams, load_engine, render_prompt
from tests.factories import random_adapter
from tests.pipelines.test_generate import BASE_ID, TICKETS, one_thread  # noqa: F401 (a fixture)
from tests.utils.greedy import same_or_tie

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = get_base(BASE_ID)
    cache = tmp_path_factory.getbasetemp() / "model-cache"
    adapters = {f"ft-{i}": random_adapter(base, cache, seed=i) for i in (1, 2, 3)}
    batch = load_engine(base, model_source="standin", cache_root=str(cache), adapters=adapters, max_batch_rows=16)
    online = OnlineEngine(load_engine(base, model_source="standin", cache_root=str(cache), adapters={}, max_batch_rows=4))
    yield base, batch, online, adapters
    online.close()


def ids(batch, base, ticket: str) -> tuple[int, ...]:
    return tuple(render_prompt([{"role": "system", "content": "Label the ticket."}, {"role": "user", "content": ticket}],
                               batch.tokenizer, base))  # fmt: skip


async def collect(online, request, adapter=None) -> list:
    return [d async for d in online.stream(request, adapter)]


async def hold_all(online, adapters, names):
    return [await online.hold_adapter(n, lambda n=n: adapters[n]) for n in names]


def test_concurrent_streams_decode_together_and_each_answers_as_its_adapter(setup):
    base, batch, online, adapters = setup
    names = [None, "ft-1", "ft-2", "ft-3"]
    cases = [(names[i % 4], OnlineRequest(ids(batch, base, TICKETS[i % 6] + " x" * i), max_tokens=6 + 3 * i, temperature=0))
             for i in range(9)]  # fmt: skip

    async def run(together: bool):
        holds = await hold_all(online, adapters, names[1:])
        if together:
            answers = await asyncio.gather(*(collect(online, r, a) for a, r in cases))
        else:
            answers = [await collect(online, r, a) for a, r in cases]
        del holds
        return answers

    solo = [batch.generate([GenRequest(0, a, r.prompt_ids, SamplingParams(r.max_tokens, 0.0))])[0] for a, r in cases]
    # One at a time, the online engine's greedy answer is the batch engine's, token for token.
    for deltas, want in zip(asyncio.run(run(together=False)), solo):
        assert "".join(d.text for d in deltas) == want.text
        assert (deltas[-1].finish_reason, deltas[-1].prompt_tokens, deltas[-1].completion_tokens) == (
            want.finish_reason, want.prompt_tokens, want.completion_tokens)
    # Together (four models in batches of four), each answers as its own model.
    together = asyncio.run(run(together=True))
    for (adapter, request), deltas, want in zip(cases, together, solo):
        assert same_or_tie(batch, request.prompt_ids, adapter, want, "".join(d.text for d in deltas)), adapter
        assert deltas[-1].completion_tokens == want.completion_tokens or deltas[-1].finish_reason == "stop"
        assert all(d.finish_reason is None for d in deltas[:-1]) and deltas[-1].finish_reason is not None
    assert len({"".join(d.text for d in a) for a in together[:4]}) == 4  # four models, four answers
    assert sum(len(a) > 2 for a in together) >= 5  # streamed in pieces, not in one


def test_a_stop_string_is_never_streamed(setup):
    base, batch, online, _ = setup
    prompt = ids(batch, base, TICKETS[1])
    full = batch.generate([GenRequest(0, None, prompt, SamplingParams(12, 0.0))])[0]
    stop = full.text[4:7]
    deltas = asyncio.run(collect(online, OnlineRequest(prompt, 12, temperature=0, stop=(stop, "never"))))
    assert "".join(d.text for d in deltas) == full.text[: full.text.find(stop)]
    assert deltas[-1].finish_reason == "stop"


def test_a_request_joins_the_running_batch_and_a_closed_stream_leaves_it(setup):
    base, batch, online, _ = setup
    long = OnlineRequest(ids(batch, base, TICKETS[0]), max_tokens=60, temperature=0)
    short = OnlineRequest(ids(batch, base, TICKETS[2]), max_tokens=3, temperature=0)

    async def run():
        events = []
        first = online.stream(long)

        async def read_long():
            async for d in first:
                events.append(("long", d.finish_reason))
                if len(events) == 3:
                    # The short request arrives while the long one decodes, and ends before it.
                    short_deltas = await collect(online, short)
                    events.append(("short", short_deltas[-1].finish_reason))
        await read_long()
        return events

    events = asyncio.run(run())
    assert events.index(("short", "length")) < len(events) - 1 and events[-1] == ("long", "length")

    async def leave():
        stream = online.stream(long)
        await stream.__anext__()
        await stream.aclose()  # the client left
        for _ in range(100):
            if online.stats()["decoding"] == 0 and online.stats()["queued"] == 0:
                return online.stats()
            await asyncio.sleep(0.05)
        return online.stats()

    stats = asyncio.run(leave())
    assert (stats["decoding"], stats["queued"]) == (0, 0)


def test_adapters_load_once_stay_while_used_and_unload_when_evicted(setup):
    base, batch, online, adapters = setup
    request = OnlineRequest(ids(batch, base, TICKETS[3]), max_tokens=200, temperature=0)

    async def run():
        before = online.stats()
        hold = await online.hold_adapter("ft-1", lambda: adapters["ft-1"])
        again = await online.hold_adapter("ft-1", lambda: pytest.fail("a resident adapter is not read again"))
        assert online.stats()["loads"] == before["loads"] + (0 if "ft-1" in before["resident"] else 1)
        stream = online.stream(request, "ft-1")
        first = await stream.__anext__()
        hold.__del__()
        again.__del__()  # evicted twice over while its request decodes: it stays until the request ends
        while (stats := online.stats())["decoding"]:
            assert "ft-1" in stats["resident"]
            await asyncio.sleep(0.01)
        rest = [d async for d in stream]
        for _ in range(100):
            if "ft-1" not in online.stats()["resident"]:
                break
            await asyncio.sleep(0.05)
        after = online.stats()
        assert "ft-1" not in after["resident"] and after["evictions"] == before["evictions"] + 2
        assert after["unloads"] > before["unloads"]
        # Loaded again on demand, it answers as before.
        hold = await online.hold_adapter("ft-1", lambda: adapters["ft-1"])
        again = [d async for d in online.stream(request, "ft-1")]
        del hold
        return first, rest, again

    first, rest, again = asyncio.run(run())
    assert first.text + "".join(d.text for d in rest) == "".join(d.text for d in again)
    expected = batch.generate([GenRequest(0, "ft-1", request.prompt_ids, SamplingParams(200, 0.0))])[0]
    assert "".join(d.text for d in again) == expected.text


def test_an_adapter_not_held_is_refused(setup):
    base, batch, online, _ = setup

    async def run():
        with pytest.raises(ValueError, match="not held"):
            await collect(online, OnlineRequest(ids(batch, base, TICKETS[0]), 4), "ft-9")

    asyncio.run(run())


# Paced by the interval, or by the replica's chunk budget alone (0 interval: unpaced but for the
# budget, which 3 open streams at 1 chunk an hour stretch to an hour each).
@pytest.mark.parametrize("pace", [{"stream_interval": 3600.0}, {"stream_interval": 0.0, "chunks_per_second": 1 / 3600}],
                         ids=["interval", "chunk_budget"])
def test_paced_streams_send_the_first_text_at_once_and_the_rest_in_fewer_pieces(setup, tmp_path_factory, pace):
    base, batch, _, adapters = setup
    cache = tmp_path_factory.getbasetemp() / "model-cache"
    paced = OnlineEngine(load_engine(base, model_source="standin", cache_root=str(cache), adapters={},
                                     max_batch_rows=4), **pace)  # fmt: skip
    cases = [(a, OnlineRequest(ids(batch, base, TICKETS[i]), max_tokens=20, temperature=0))
             for i, a in enumerate([None, "ft-1", "ft-2"])]  # fmt: skip

    async def run():
        holds = await hold_all(paced, adapters, ["ft-1", "ft-2"])
        answers = await asyncio.gather(*(collect(paced, r, a) for a, r in cases))
        del holds
        return answers

    try:
        answers = asyncio.run(run())
    finally:
        paced.close()
    for (adapter, request), deltas in zip(cases, answers):
        want = batch.generate([GenRequest(0, adapter, request.prompt_ids, SamplingParams(request.max_tokens, 0.0))])[0]
        assert same_or_tie(batch, request.prompt_ids, adapter, want, "".join(d.text for d in deltas)), adapter
        # Within the interval: the first text as soon as it decodes, then the rest with the finish.
        assert len(deltas) == 2 and deltas[0].completion_tokens < 5 and deltas[0].text, [d.completion_tokens for d in deltas]
        assert deltas[-1].finish_reason is not None and deltas[-1].completion_tokens == want.completion_tokens
