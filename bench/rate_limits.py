"""What the per-key rate limit costs a request: the same app, served by uvicorn without Ray, with
the general bucket on (every request upserts its key's bucket row) and off (no write at all).

For each backend (SQLite file, PostgreSQL on 127.0.0.1:5432 when reachable), in one run and
alternating off/on rounds so that the machine's noise falls on both alike: `--clients` concurrent
clients, each with a key of its own, call `GET /v1/fine_tuning/jobs` (the key lookup plus one
query) for `--seconds`; then one client alone, for the latency one request adds. The bucket is
set far above the offered rate, so every request pays for the write and none is refused. The
last line printed is one JSON object: per backend, req/s and p50/p99 with limits off and on, the
throughput ratio on/off, the added p50 of a lone request in ms, and (`db_path`) the
authentication's database work alone, with and without the bucket's upsert, alternated call by call.

    python bench/rate_limits.py [--clients 64] [--seconds 8] [--rounds 2] [--db-calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openft.settings import Settings  # noqa: E402
from serve_app.app import create_app  # noqa: E402  (imported once here; each server is a fork)
from tests.utils.ports import free_port  # noqa: E402

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
UNTHROTTLED = {"rate_limit_requests_per_second": 1e9, "rate_limit_requests_burst": 10**9}
OFF = {"rate_limit_requests_per_second": 0}


def _serve(settings: Settings, port: int) -> None:
    import uvicorn

    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _keys(settings: Settings, n: int) -> list[str]:
    from storage.accounts import create_account
    from storage.db import Database

    db = Database(settings.resolved_database_url())
    with db.session() as session:
        keys = [create_account(session, f"bench-{uuid.uuid4().hex[:10]}", open_jobs_limit=1)[1] for _ in range(n)]
    db.dispose()
    return keys


async def _load(base: str, keys: list[str], seconds: float) -> tuple[list[float], int]:
    """Latencies of the calls answered 200, and how many calls failed (other status, dropped)."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=len(keys), max_keepalive_connections=len(keys))
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        async def one(key: str) -> None:
            headers = {"Authorization": f"Bearer {key}"}
            nonlocal errors
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    response = await client.get("/v1/fine_tuning/jobs", headers=headers)
                except httpx.TransportError:
                    errors += 1
                    continue
                if response.status_code != 200:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(one(k) for k in keys))
    return latencies, errors


def _figures(latencies: list[float], seconds: float) -> dict:
    ordered = sorted(latencies)
    return {"rps": round(len(ordered) / seconds, 1), "p50_ms": round(1000 * statistics.median(ordered), 2),
            "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2)}


def bench_backend(database_url: str | None, data_dir: Path, clients: int, seconds: float, rounds: int) -> dict:
    base_settings = Settings(data_dir=data_dir, database_url=database_url)
    keys = _keys(base_settings, clients)
    results: dict[str, dict[str, list[float]]] = {"off": {"many": [], "one": []}, "on": {"many": [], "one": []}}
    errors = {"off": 0, "on": 0}
    ctx = multiprocessing.get_context("fork")
    for _ in range(rounds):
        for mode, limits in (("off", OFF), ("on", UNTHROTTLED)):
            port = free_port()
            server = ctx.Process(target=_serve, args=(base_settings.model_copy(update=limits), port), daemon=True)
            server.start()
            base = f"http://127.0.0.1:{port}"
            try:
                _wait_up(base)
                for kind, clients_keys, span in (("many", keys, seconds), ("one", keys[:1], seconds / 2)):
                    latencies, failed = asyncio.run(_load(base, clients_keys, span))
                    results[mode][kind] += latencies
                    errors[mode] += failed
            finally:
                server.terminate()
                server.join()
    span = seconds * rounds
    off, on = (_figures(results[m]["many"], span) for m in ("off", "on"))
    lone = {m: statistics.median(results[m]["one"]) * 1000 for m in ("off", "on")}
    return {f"{clients}_clients_off": off, f"{clients}_clients_on": on,
            "throughput_ratio_on_off": round(on["rps"] / off["rps"], 3),
            "lone_p50_ms_off": round(lone["off"], 2), "lone_p50_ms_on": round(lone["on"], 2),
            "lone_added_ms": round(lone["on"] - lone["off"], 2), "errors": errors}


def bench_db_path(database_url: str | None, data_dir: Path, n: int) -> dict:
    """The authentication's database work alone, alternating without and with the bucket's upsert
    call by call (medians: this shared machine's noise dwarfs a round trip end to end)."""
    from serve_app import rate_limits
    from storage.api_keys import lookup
    from storage.db import Database

    settings = Settings(data_dir=data_dir, database_url=database_url, **UNTHROTTLED)
    key = _keys(settings, 1)[0]
    db = Database(settings.resolved_database_url())
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * n):
        limited = bool(i % 2)
        started = time.perf_counter()
        with db.session() as session:
            _, account = lookup(session, key)
            if limited:
                rate_limits.take(session, settings, account.id, rate_limits.GENERAL)
        times[limited].append(time.perf_counter() - started)
    db.dispose()
    off, on = (statistics.median(times[m]) * 1000 for m in (False, True))
    return {"auth_p50_ms_off": round(off, 3), "auth_p50_ms_on": round(on, 3), "added_ms": round(on - off, 3)}


def _wait_up(base: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/v1/models", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def _pg_database():
    import sqlalchemy as sa

    engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    name = f"openft_bench_{uuid.uuid4().hex[:8]}"
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError:
        return None, lambda: None

    def drop() -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, drop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--db-calls", type=int, default=2000, help="authentications of each kind, database path alone")
    args = parser.parse_args()
    out: dict = {"route": "GET /v1/fine_tuning/jobs", "server": "uvicorn, one process, no Ray"}
    with tempfile.TemporaryDirectory(prefix="openft-bench-rl-") as tmp:
        out["sqlite"] = bench_backend(None, Path(tmp) / "sqlite", args.clients, args.seconds, args.rounds)
        out["sqlite"]["db_path"] = bench_db_path(None, Path(tmp) / "sqlite", args.db_calls)
        url, drop = _pg_database()
        try:
            if url is not None:
                out["postgres"] = bench_backend(url, Path(tmp) / "pg", args.clients, args.seconds, args.rounds)
                out["postgres"]["db_path"] = bench_db_path(url, Path(tmp) / "pg", args.db_calls)
        finally:
            drop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
