"""Online chat completions through the SDK (`client.chat.completions.create`, streamed and not) on the
billing deployment's online replica of the qwen2.5 stand-in, with fine-tunes registered from random
adapters (tests/factories.py): the answers of the base and of four fine-tunes decoded together,
each equal to the batch engine's (in this process) for the same request, streamed pieces equal to the
whole, adapters loaded and evicted by the replica, every refusal with its status, code and param and
nothing charged, the generation bucket and the generations-at-once cap, and the charge in whole cents.

The trained ticket fine-tunes (held-out answers, Promptfoo, 16 clients over 4 fine-tunes) are in
tests/e2e/test_online.py (make test-e2e)."""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from sqlalchemy import func, select

from catalog.bases import get_base
from online.protocol import deployment_name
from pipelines.generate import GenRequest, SamplingParams, load_engine, render_prompt
from storage import billing
from storage.db import Database
from storage.models import Account, FineTunedModel, LedgerEntry, OnlineUsage
from tests.factories import db_ft_model, random_adapter
from tests.pipelines.test_generate import BASE_ID as BASE
from tests.pipelines.test_generate import TICKETS
from tests.utils.greedy import same_or_tie
from tests.utils.polling import until

SYSTEM = "Label the ticket."


def messages(ticket: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]


@pytest.fixture(scope="module")
def api(admin_api):
    return admin_api


@pytest.fixture(scope="module")
def db(api):
    database = Database(api.settings.resolved_database_url())
    yield database
    database.dispose()


def new_account(api, db, usd: str = "100.00") -> tuple[openai.OpenAI, str, str]:
    """(client, account id, key) of a new account with `usd` of credit."""
    account_id, key = api.create_account(f"chat-{uuid.uuid4().hex[:8]}")
    with db.session() as session:
        billing.deposit(session, session.get(Account, account_id), billing.to_cents(usd), int(time.time()))
    return api.client(key, timeout=300), account_id, key


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[int, dict[str, bytes]]:
    cache = tmp_path_factory.getbasetemp() / "chat-model-cache"
    return {seed: random_adapter(get_base(BASE), cache, seed=seed) for seed in (1, 2, 3, 4)}


@pytest.fixture(scope="module")
def reference(adapters, tmp_path_factory):
    """The batch engine in this process, with the same four adapters (by seed)."""
    cache = tmp_path_factory.getbasetemp() / "chat-model-cache"
    return load_engine(get_base(BASE), model_source="standin", cache_root=str(cache),
                       adapters={str(seed): files for seed, files in adapters.items()})  # fmt: skip


def solo(reference, ticket: str, adapter: str | None, max_tokens: int):
    ids = tuple(render_prompt(messages(ticket), reference.tokenizer, get_base(BASE)))
    return ids, reference.generate([GenRequest(0, adapter, ids, SamplingParams(max_tokens, 0.0))])[0]


def store_of(api):
    from storage.objects import open_object_store

    return open_object_store(api.settings.resolved_storage_url())


def replica_stats(api) -> dict:
    from ray import serve

    return serve.get_deployment_handle(deployment_name(BASE), app_name=api.name).stats.remote().result()


def ask(client, model: str, ticket: str, max_tokens: int = 12, **kw):
    return client.chat.completions.create(model=model, messages=messages(ticket), max_tokens=max_tokens,
                                          temperature=0, **kw)  # fmt: skip


def test_the_base_answers_as_the_batch_engine_streamed_or_not(api, db, reference):
    client, _, _ = new_account(api, db)
    for ticket in TICKETS[:3]:
        ids, want = solo(reference, ticket, None, 12)
        whole = ask(client, BASE, ticket)
        chunks = list(ask(client, BASE, ticket, stream=True, stream_options={"include_usage": True}))
        assert whole.object == "chat.completion" and whole.model == BASE and whole.id.startswith("chatcmpl-")
        choice = whole.choices[0]
        assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", want.text, want.finish_reason)
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (
            len(ids), want.completion_tokens, len(ids) + want.completion_tokens)
        # The role first, the text in pieces, the finish reason, then usage alone; one id throughout.
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
        assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == want.text
        assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == want.finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
        assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1
        assert all(c.object == "chat.completion.chunk" and c.model == BASE for c in chunks)
    # Without include_usage no usage chunk; the SDK reads to [DONE].
    plain = list(ask(client, BASE, TICKETS[0], stream=True))
    assert plain[-1].choices[0].finish_reason is not None and all(c.usage is None for c in plain)


def test_four_fine_tunes_decode_together_and_each_answers_as_its_own(api, db, adapters, reference):
    client, account_id, _ = new_account(api, db)
    models = {seed: db_ft_model(db, store_of(api), account_id, files) for seed, files in adapters.items()}
    before = replica_stats(api) if _replica_up(api) else {"loads": 0, "evictions": 0}
    # One at a time: each fine-tune's greedy answer is the batch engine's, token for token.
    for seed, model in models.items():
        _, want = solo(reference, TICKETS[seed], str(seed), 16)
        assert ask(client, model, TICKETS[seed], 16).choices[0].message.content == want.text
    # Eight at once over the four (the account's cap), on a replica that keeps two adapters loaded.
    cases = [(seed, TICKETS[(seed + i) % 6]) for i in range(2) for seed in models]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda c: ask(client, models[c[0]], c[1], 16).choices[0].message.content, cases))
    texts = {}
    for (seed, ticket), got in zip(cases, answers):
        ids, want = solo(reference, ticket, str(seed), 16)
        assert same_or_tie(reference, ids, str(seed), want, got), (seed, ticket)
        texts.setdefault(ticket, []).append(got)
    assert all(len(set(t)) == len(t) for t in texts.values())  # models asked the same ticket answer apart
    stats = replica_stats(api)
    assert stats["loads"] - before["loads"] >= 4 and stats["evictions"] - before["evictions"] >= 2, stats
    assert len(stats["resident"]) <= 2 and stats["decoding"] == 0


def _replica_up(api) -> bool:
    from ray import serve

    status = serve.status().applications[api.name].deployments[deployment_name(BASE)]
    return status.replica_states.get("RUNNING", 0) > 0


def test_a_deleted_model_stops_answering_at_once(api, db, adapters):
    client, account_id, _ = new_account(api, db)
    model = db_ft_model(db, store_of(api), account_id, adapters[1])
    assert ask(client, model, TICKETS[0], 2).choices[0].finish_reason == "length"
    client.models.delete(model)
    with pytest.raises(openai.NotFoundError) as info:
        ask(client, model, TICKETS[0], 2)
    assert (info.value.body["code"], info.value.body["param"]) == ("model_not_found", "model")


def post(api, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{api.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=120)


def charged(db, account_id: str) -> tuple[int, int]:
    """(charge entries, online usage rows) of an account."""
    with db.session() as session:
        charges = session.scalar(select(func.count()).select_from(LedgerEntry).where(
            LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"))
        usage = session.scalar(select(func.count()).select_from(OnlineUsage).where(OnlineUsage.account_id == account_id))
    return charges, usage


def test_every_refusal_names_its_field_and_nothing_runs_or_is_charged(api, db, adapters):
    _, account_id, key = new_account(api, db)
    _, other_id, _ = new_account(api, db)
    store = store_of(api)
    theirs = db_ft_model(db, store, other_id, adapters[2])
    unservable = db_ft_model(db, store, account_id, adapters[3])
    with db.session() as session:
        row = session.get(FineTunedModel, unservable)
        row.servable, row.reason = False, "parity_end_of_turn: the adapter did not end its turns."
    good = {"model": BASE, "messages": messages(TICKETS[0]), "max_tokens": 4}
    long = [{"role": "user", "content": "word " * 3000}]
    cases = [
        ({**good, "model": "ft:qwen2.5-0.5b-instruct:nobody:000000000000"}, 404, "model_not_found", "model"),
        ({**good, "model": theirs}, 404, "model_not_found", "model"),
        ({**good, "model": "no-such-base"}, 404, "model_not_found", "model"),
        ({**good, "model": "gpt-oss-20b"}, 400, "model_not_available", "model"),  # a base that is not servable
        ({**good, "model": "qwen3-8b"}, 400, "model_not_available", "model"),  # servable, not served online here
        ({**good, "model": unservable}, 400, "model_not_available", "model"),
        ({**good, "logprobs": True}, 400, "unsupported_field", "logprobs"),
        ({**good, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "unsupported_field", "tools"),
        ({**good, "response_format": {"type": "json_object"}}, 400, "unsupported_field", "response_format"),
        ({**good, "n": 2}, 400, "unsupported_value", "n"),
        ({**good, "temperature": 3}, 400, "invalid_value", "temperature"),
        ({**good, "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
        ({**good, "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value", "stop"),
        ({**good, "messages": []}, 400, "invalid_value", "messages"),
        ({**good, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         400, "invalid_value", "messages[0]"),
        ({**good, "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_value", "messages[0]"),
        ({**good, "messages": [{"role": "user", "content": "hi <|im_end|> there"}]}, 400, "template_token_in_content",
         "messages"),
        ({**good, "stream": "yes"}, 400, "invalid_value", "stream"),
        ({**good, "stream_options": {"include_usage": True}}, 400, "invalid_value", "stream_options"),
        ({**good, "stream": True, "stream_options": {"include_obfuscation": True}}, 400, "unsupported_field",
         "stream_options.include_obfuscation"),
        ({**good, "messages": long}, 400, "context_length_exceeded", "messages"),
        ({**good, "max_tokens": 5000}, 400, "context_length_exceeded", "messages"),
    ]
    before = replica_stats(api) if _replica_up(api) else None
    for body, status, code, param in cases:
        response = post(api, key, body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert (error["code"], error["param"]) == (code, param), (body, error)
        # Never the caller's text; said as this route's (no batch line, no file).
        assert "word word" not in error["message"] and not re.search(r"\bline \d|\bfile\b|body\.|in batches|fix the line", error["message"])
    if before is not None:  # nothing reached the replica
        assert {k: replica_stats(api)[k] for k in ("loads", "queued", "decoding")} == {
            "loads": before["loads"], "queued": 0, "decoding": 0}
    assert charged(db, account_id) == (0, 0)
    # The SDK raises its typed errors for them.
    client = api.client(key)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=theirs, messages=messages("x"))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=BASE, messages=messages("x"), extra_body={"n": 3})


def test_the_generation_bucket_and_the_generations_at_once(api, db):
    client, account_id, key = new_account(api, db)
    # The bucket (30, 1 a second) is taken before the prompt is read: over-context requests use it up.
    over = {"model": BASE, "messages": messages(TICKETS[0]), "max_tokens": 5000}
    for sent in range(1, 61):
        response = post(api, key, over)
        if response.status_code == 429:
            break
        assert response.json()["error"]["code"] == "context_length_exceeded"
    assert sent > 30 and response.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) >= 1 and "x-should-retry" not in response.headers
    # The SDK raises its typed error for it. Its requests are over-context too: a token refilled since
    # the 429 (a second on a loaded machine) is used up by a 400, never spent on a generation.
    with pytest.raises(openai.RateLimitError):
        for _ in range(10):
            try:
                client.chat.completions.create(**over)
            except openai.BadRequestError as e:
                assert e.code == "context_length_exceeded"

    # Eight generating at once (the account's cap, across replicas); a ninth waits for one of them.
    client, account_id, key = new_account(api, db)
    streams = [ask(client, BASE, TICKETS[i % 6], 1500, stream=True) for i in range(8)]
    for stream in streams:  # the role, then a first piece of text: each has been sent something
        chunks = iter(stream)
        next(chunks), next(chunks)
    try:
        response = post(api, key, {"model": BASE, "messages": messages(TICKETS[0]), "max_tokens": 2})
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert (error["code"], error["type"], error["limit"]) == ("rate_limit_exceeded", "rate_limit_error",
                                                                 {"limit": 8, "current": 8})  # fmt: skip
        assert response.headers["retry-after"] == "1"
    finally:
        for stream in streams:
            stream.close()  # the clients leave: their rows leave the batch and their slots are freed
    deadline = time.monotonic() + 60
    while (answer := post(api, key, {"model": BASE, "messages": messages(TICKETS[0]), "max_tokens": 2})).status_code == 429:
        assert time.monotonic() < deadline, "the slots of streams that were closed were not freed"
        time.sleep(0.5)
    assert answer.status_code == 200, answer.text

    def charged_all() -> bool:  # the streams whose clients left are charged what they had been sent
        with db.session() as session:
            usage = session.get(OnlineUsage, (account_id, BASE))
            return usage is not None and usage.requests == 9 and usage.completion_tokens >= 8 + 2

    until(charged_all, "the charge of the eight streams left and the last answer", 30)


def test_online_tokens_are_charged_in_whole_cents(api, db):
    client, account_id, key = new_account(api, db, usd="1.00")
    usages = [ask(client, BASE, t, 20).usage for t in TICKETS[:3]]
    tokens = sum(u.total_tokens for u in usages)
    # 1,000 USD per million tokens: a tenth of a cent a token, charged a whole cent at a time.
    with db.session() as session:
        usage = session.get(OnlineUsage, (account_id, BASE))
        cents = -sum(e.amount_cents for e in session.scalars(select(LedgerEntry).where(
            LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge")))
        assert (usage.requests, usage.prompt_tokens + usage.completion_tokens) == (3, tokens)
        assert usage.accrued_microcents == tokens * 100_000 and cents == usage.charged_cents == tokens // 10
        available = billing.credit(session, account_id).available_cents
    assert available == 100 - tokens // 10
    # A request whose most (prompt + max_tokens) the credit cannot fund is refused before it runs.
    response = post(api, key, {"model": BASE, "messages": messages(TICKETS[0]), "max_tokens": 1500})
    assert response.status_code == 429 and response.json()["error"]["code"] == "insufficient_quota"
    assert response.json()["error"]["type"] == "insufficient_quota" and response.headers["x-should-retry"] == "false"
    with db.session() as session:
        assert billing.credit(session, account_id).available_cents == available
