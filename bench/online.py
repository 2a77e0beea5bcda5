"""Online chat completions under load: the service's continuous batching against the same engine
serving one request at a time, and against plain transformers `generate` with peft, in one run, on
the qwen2.5-0.5b stand-in with 4 random adapters registered as ft: models of one account.

  (a) batched: `openft`'s API and one online replica of the base on Ray Serve (online_max_batch_rows
      16), called through the official SDK with `stream=True`, as a user calls it, streamed at the
      service's pace (online_stream_interval_seconds and online_stream_chunks_per_second, from
      OPENFT_ONLINE_STREAM_INTERVAL_SECONDS and OPENFT_ONLINE_STREAM_CHUNKS_PER_SECOND);
  (a') batched with no chunk budget: (a) with online_stream_chunks_per_second 0, so every stream
      sends a chunk per interval however many are open: what the replica-wide budget gains;
  (b) one at a time: the same service with online_max_batch_rows 1 (the same engine, a request
      decodes alone, the others wait in its queue);
  (c) plain transformers: `model.generate` on a peft model holding the 4 adapters (`set_adapter`
      per request) with a `TextIteratorStreamer`, one request at a time under a lock, in this process;
  (d) the engine alone, batched and one at a time: the replica's engine (online/engine.py
      `OnlineEngine` over the same `load_engine`, the same pacing) driven in this process by asyncio
      clients, with no Serve, HTTP or SDK around it: what continuous batching itself gains, apart
      from what each request costs on its way through the service.
At 1, 4 and 16 concurrent clients, each client asking `--requests` requests in turn over the 4 adapters
(client i starts at adapter i % 4), every request greedy with `--max-tokens` tokens (random adapters
rarely end their turn, so each answer is that long). Ways (a), (a'), (b) and (c) are measured
interleaved: every level `--rounds` times, each round one load of every way, one after the other, so
that the host's drift (here its speed swings by half within minutes) falls on every way alike; a
way's figures at a level are over all its rounds together, and `rounds_16` gives each round's
requests per second at 16 clients. The three services stay deployed, each with its online replica,
through every round. Per way and level: requests per second over the level's wall
time, p50 and p99 time to first token (the first streamed text), and tokens per second (completion
tokens over that wall time). The replicas' torch threads and this process's are one
each, the machine's cores shared. The last line printed is one JSON object with every figure and
`ratio_vs_one_at_a_time` / `ratio_vs_plain` / `chunk_budget_ratio` / `engine_alone_ratio` (requests
per second at 16 clients; the budget's is (a) over (a')).

    python bench/online.py [--requests 4] [--rounds 3] [--max-tokens 32] [--ingress proxy|haproxy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import random_adapter
from catalog.bases import get_base
from openft.demo_data import SYSTEM, ticket_splits
from openft.settings import Settings

BASE_ID = "qwen2.5-0.5b-instruct"
ADAPTERS = 4
LEVELS = (1, 4, 16)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _figures(samples: list[tuple[float, int]], wall: float) -> dict:
    """samples: (time to first token, completion tokens) per request."""
    first = [s[0] for s in samples]
    return {"requests": len(samples), "requests_per_s": round(len(samples) / wall, 3),
            "ttft_p50_s": round(statistics.median(first), 4), "ttft_p99_s": round(_percentile(first, 0.99), 4),
            "tokens_per_s": round(sum(s[1] for s in samples) / wall, 1), "wall_s": round(wall, 2)}  # fmt: skip


def _load(ask, models: list[str], tickets: list[str], clients: int, per_client: int) -> tuple[list[tuple[float, int]], float]:
    """(samples, wall seconds) of `clients` clients asking `per_client` requests each."""
    def client(i: int) -> list[tuple[float, int]]:
        return [ask(models[(i + n) % len(models)], tickets[(i * per_client + n) % len(tickets)]) for n in range(per_client)]

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        samples = [s for run in pool.map(client, range(clients)) for s in run]
    return samples, time.monotonic() - started


def _interleaved(ways: dict[str, tuple], tickets: list[str], per_client: int, rounds: int) -> tuple[dict, dict]:
    """Every level `rounds` times, a load of each way per round: ({way: {level: figures}},
    {way: [requests per second of each round at the top level]})."""
    samples = {name: {n: [] for n in LEVELS} for name in ways}
    walls = {name: dict.fromkeys(LEVELS, 0.0) for name in ways}
    top = {name: [] for name in ways}
    for n in LEVELS:
        for _ in range(rounds):
            for name, (ask, models) in ways.items():
                got, wall = _load(ask, models, tickets, n, per_client)
                samples[name][n] += got
                walls[name][n] += wall
                if n == LEVELS[-1]:
                    top[name].append(round(len(got) / wall, 2))
    figures = {name: {str(n): _figures(samples[name][n], walls[name][n]) for n in LEVELS} for name in ways}
    return figures, top


def _service(name: str, data_dir: Path, port: int, batch_rows: int, chunks_per_second: float | None):
    from entrypoints.ray_runtime import deploy_api

    budget = {} if chunks_per_second is None else {"online_stream_chunks_per_second": chunks_per_second}
    settings = Settings(data_dir=data_dir / name, model_source="standin", online_bases=[BASE_ID], online_min_replicas=1,
                        online_max_batch_rows=batch_rows, online_max_ongoing_requests=64, online_adapters_per_replica=8,
                        rate_limit_requests_per_second=0, rate_limit_generations_per_second=0,
                        online_generations_per_account=0, **budget)  # fmt: skip
    return settings, deploy_api(settings, host="127.0.0.1", port=port, name=name, route_prefix=f"/{name}")


def _sdk_ask(client, max_tokens: int):
    def ask(model: str, ticket: str) -> tuple[float, int]:
        started, first, tokens = time.monotonic(), None, 0
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}],
            max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})  # fmt: skip
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - started
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return (first if first is not None else time.monotonic() - started), tokens

    return ask


def _register(settings: Settings, adapters: dict[str, dict[str, bytes]]) -> tuple[str, list[str]]:
    """An account with the 4 adapters as its ft: models: (API key, model names)."""
    from storage.accounts import create_account
    from storage.db import Database
    from storage.objects import open_object_store
    from tests.factories import db_ft_model

    db = Database(settings.resolved_database_url())
    with db.session() as session:
        account, key = create_account(session, f"bench-{uuid.uuid4().hex[:6]}", open_jobs_limit=1)
        account_id = account.id
    store = open_object_store(settings.resolved_storage_url())
    names = [db_ft_model(db, store, account_id, files) for files in adapters.values()]
    db.dispose()
    return key, names


def _plain(base, cache_root: Path, adapters: dict[str, dict[str, bytes]], max_tokens: int):
    """Plain transformers + peft, one request at a time (a lock), streamed by TextIteratorStreamer."""
    import torch
    from peft import PeftModel
    from transformers import TextIteratorStreamer

    from catalog.model_source import ModelSource, load_model, load_tokenizer
    from pipelines.generate import end_of_turn_ids, render_prompt

    tokenizer = load_tokenizer(base, ModelSource("standin"), cache_root)
    model = load_model(base, ModelSource("standin"), cache_root)
    for i, files in enumerate(adapters.values()):
        directory = cache_root / f"plain-{i}"
        directory.mkdir(exist_ok=True)
        for filename, data in files.items():
            (directory / filename).write_bytes(data)
        if i == 0:
            model = PeftModel.from_pretrained(model, directory, adapter_name=f"a{i}")
        else:  # load_adapter answers the keys it did not match, not the model
            model.load_adapter(directory, adapter_name=f"a{i}")
    model.eval()
    eot, lock = list(end_of_turn_ids(tokenizer, base)), threading.Lock()
    names = [f"a{i}" for i in range(len(adapters))]

    def ask(adapter: str, ticket: str) -> tuple[float, int]:
        started = time.monotonic()
        ids = render_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}], tokenizer, base)
        with lock:
            streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            out = {}

            def run():
                with torch.inference_mode():
                    model.set_adapter(adapter)
                    out["ids"] = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False,
                                                eos_token_id=eot, pad_token_id=tokenizer.pad_token_id, streamer=streamer)  # fmt: skip

            worker = threading.Thread(target=run)
            worker.start()
            first = None
            for piece in streamer:
                if first is None and piece:
                    first = time.monotonic() - started
            worker.join()
        return (first if first is not None else time.monotonic() - started), int(out["ids"].shape[1] - len(ids))

    return ask, names


def _engine_alone(base, cache_root: Path, adapters: dict[str, dict[str, bytes]], tickets: list[str], rows: int,
                  max_tokens: int, per_client: int) -> dict:
    """Way (d): the replica's engine with `rows` batch rows, driven by asyncio clients in this process."""
    import asyncio

    from online.engine import OnlineEngine
    from online.protocol import OnlineRequest
    from pipelines.generate import load_engine, render_prompt

    engine = load_engine(base, model_source="standin", cache_root=str(cache_root), adapters={}, max_batch_rows=rows)
    settings = Settings()
    online = OnlineEngine(engine, stream_interval=settings.online_stream_interval_seconds,
                          chunks_per_second=settings.online_stream_chunks_per_second)
    prompts = [tuple(render_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                   engine.tokenizer, base)) for t in tickets]  # fmt: skip

    async def run() -> dict:
        holds = [await online.hold_adapter(name, lambda files=files: files) for name, files in adapters.items()]
        names = [h.name for h in holds]

        async def ask(adapter: str, prompt: tuple[int, ...]) -> tuple[float, int]:
            started, first, tokens = time.monotonic(), None, 0
            async for delta in online.stream(OnlineRequest(prompt, max_tokens, temperature=0.0), adapter):
                if first is None and delta.text:
                    first = time.monotonic() - started
                tokens = delta.completion_tokens
            return (first if first is not None else time.monotonic() - started), tokens

        async def client(i: int) -> list[tuple[float, int]]:
            return [await ask(names[(i + n) % len(names)], prompts[(i * per_client + n) % len(prompts)])
                    for n in range(per_client)]  # fmt: skip

        await ask(names[0], prompts[0])
        levels = {}
        for n in LEVELS:
            started = time.monotonic()
            samples = [s for run in await asyncio.gather(*(client(i) for i in range(n))) for s in run]
            levels[str(n)] = _figures(samples, time.monotonic() - started)
        return levels

    try:
        return asyncio.run(run())
    finally:
        online.close()


def _haproxy_environment(directory: Path) -> None:
    """Ray Serve's HAProxy mode for the cluster this process starts (Serve's processes read it from
    the environment they inherit): HAProxy takes the HTTP port and forwards to each API replica's own
    HTTP server, with no Python proxy and no Ray hop between them. Its files and ports are this run's
    own (Ray's defaults are fixed paths under /tmp and fixed ports)."""
    import os
    import shutil

    from tests.utils.ports import free_port

    if shutil.which("haproxy") is None:
        raise SystemExit("--ingress haproxy needs the haproxy binary (Debian: apt-get install haproxy)")
    directory.mkdir(parents=True)
    os.environ.update({
        "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(directory / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(directory / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(directory),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(directory / "server-state"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4, help="requests per client at each level and round")
    parser.add_argument("--rounds", type=int, default=3, help="loads of each way per level, interleaved")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy",
                        help="Serve's front: its Python HTTP proxy (what openft serve runs), or Ray 2.60's HAProxy "
                             "mode, an experiment (needs the haproxy binary)")
    args = parser.parse_args()

    import openai
    import torch

    from entrypoints.ray_runtime import prepare_ray_environment, start_ray

    torch.set_num_threads(1)
    data_dir = Path(tempfile.mkdtemp(prefix="oft-bo-"))  # short: Ray's socket paths live under it
    ray_settings = Settings(data_dir=data_dir / "ray-home")
    prepare_ray_environment(ray_settings)
    if args.ingress == "haproxy":
        _haproxy_environment(data_dir / "haproxy")
    start_ray(ray_settings, dashboard=False)
    from ray import serve

    from tests.utils.ports import free_port

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = get_base(BASE_ID)
    cache_root = data_dir / "model-cache"
    adapters = {f"ft-{i}": random_adapter(base, cache_root, seed=i + 1) for i in range(ADAPTERS)}
    tickets = [t for t, _ in ticket_splits()[0]]
    interleaved = {}
    for name, rows, budget in (("batched", 16, None), ("batched_no_chunk_budget", 16, 0.0), ("one_at_a_time", 1, None)):
        settings, url = _service(name, data_dir, port, rows, budget)
        key, models = _register(settings, adapters)
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=600)
        ask = _sdk_ask(client, args.max_tokens)
        for model in models:  # warm: the replica is up and every adapter loaded before the clock starts
            ask(model, tickets[0])
        interleaved[name] = (ask, models)
    ask, names = _plain(base, cache_root, adapters, args.max_tokens)
    ask(names[0], tickets[0])
    interleaved["plain_transformers"] = (ask, names)
    ways, rounds_top = _interleaved(interleaved, tickets, args.requests, args.rounds)
    for name in interleaved:
        print(name, json.dumps(ways[name]), flush=True)
    for name in ("batched", "batched_no_chunk_budget", "one_at_a_time"):
        serve.delete(name)
    for name, rows in (("engine_batched", 16), ("engine_one_at_a_time", 1)):
        ways[name] = _engine_alone(base, cache_root, adapters, tickets, rows, args.max_tokens, args.requests)
        print(name, json.dumps(ways[name]), flush=True)
    top = str(LEVELS[-1])
    result = {
        "base": BASE_ID, "adapters": ADAPTERS, "max_tokens": args.max_tokens, "requests_per_client": args.requests,
        "rounds": args.rounds, "ingress": args.ingress,
        "stream_interval_s": settings.online_stream_interval_seconds,
        "stream_chunks_per_s": settings.online_stream_chunks_per_second,
        **ways,
        "rounds_16": rounds_top,
        "ratio_vs_one_at_a_time": round(ways["batched"][top]["requests_per_s"] / ways["one_at_a_time"][top]["requests_per_s"], 2),
        "ratio_vs_plain": round(ways["batched"][top]["requests_per_s"] / ways["plain_transformers"][top]["requests_per_s"], 2),
        "chunk_budget_ratio": round(ways["batched"][top]["requests_per_s"] / ways["batched_no_chunk_budget"][top]["requests_per_s"], 2),
        "engine_alone_ratio": round(ways["engine_batched"][top]["requests_per_s"] / ways["engine_one_at_a_time"][top]["requests_per_s"], 2),
    }  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
