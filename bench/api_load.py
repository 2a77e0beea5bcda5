"""API load on loopback: the Serve deployment against the same FastAPI app on bare uvicorn.

64 clients loop over `GET /v1/files`, `GET /v1/fine_tuning/jobs/{id}` and
`GET /v1/fine_tuning/jobs/{id}/events` while 20 more upload small files, for `--seconds` per side;
one SQLite data dir serves both sides. Reports requests per second, p50/p99 latency and errors
per route, and Serve's throughput as a ratio of bare uvicorn's (the cost of the Serve hop: its
proxy, the actor call to the replica). The last line printed is one JSON object.

    python bench/api_load.py [--seconds 15] [--clients 64] [--uploaders 20] [--replicas N] [--max-ongoing N]

Targets (issue 12): 0 errors; at 64 clients at least 0.5x bare uvicorn's read throughput, and a
p99 under 1 s on retrieve. The issue's figure before: 9 req/s at a p50 of 7.1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from openft.demo_data import ticket_splits, tickets_jsonl  # noqa: E402
from openft.settings import Settings  # noqa: E402
from tests.utils.ports import free_port  # noqa: E402

READER_ACCOUNTS = 8
UPLOAD = tickets_jsonl(ticket_splits()[0][:40])  # ~10 KB: the upload path, not the disk, is measured
READS = ("list_files", "retrieve_job", "list_events")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _accounts(settings: Settings, n: int) -> list[str]:
    from storage.accounts import create_account
    from storage.db import Database

    db = Database(settings.resolved_database_url())
    keys = []
    with db.session() as session:
        for i in range(n):
            keys.append(create_account(session, f"load-{os.urandom(4).hex()}-{i}", open_jobs_limit=1)[1])
    db.dispose()
    return keys


async def _prepare(client: httpx.AsyncClient, key: str) -> str:
    """A training file and a job (queued: no controller runs here) for one reader account."""
    auth = {"Authorization": f"Bearer {key}"}
    upload = await client.post("/files", headers=auth, files={"file": ("t.jsonl", UPLOAD)}, data={"purpose": "fine-tune"})
    upload.raise_for_status()
    job = await client.post("/fine_tuning/jobs", headers=auth,
                            json={"model": "qwen2.5-0.5b-instruct", "training_file": upload.json()["id"], "seed": 0})
    job.raise_for_status()
    return job.json()["id"]


async def _load(base_url: str, readers: list[tuple[str, str]], uploaders: list[str], clients: int, seconds: float) -> dict:
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    failures: dict[str, int] = defaultdict(int)  # "route status-or-exception": count
    limits = httpx.Limits(max_connections=clients + len(uploaders) + 8, max_keepalive_connections=clients + len(uploaders) + 8)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        async def timed(route: str, call) -> None:
            started = time.monotonic()
            try:
                response = await call()
                failure = None if response.status_code < 400 else str(response.status_code)
            except httpx.HTTPError as exc:
                failure = type(exc).__name__
            if failure is None:
                latencies[route].append(time.monotonic() - started)
            else:
                errors[route] += 1
                failures[f"{route} {failure}"] += 1

        async def reader(i: int, stop: float) -> None:
            key, job = readers[i % len(readers)]
            auth = {"Authorization": f"Bearer {key}"}
            calls = {
                "list_files": lambda: client.get("/files", headers=auth),
                "retrieve_job": lambda: client.get(f"/fine_tuning/jobs/{job}", headers=auth),
                "list_events": lambda: client.get(f"/fine_tuning/jobs/{job}/events", headers=auth),
            }
            n = i
            while time.monotonic() < stop:
                route = READS[n % len(READS)]
                n += 1
                await timed(route, calls[route])

        async def uploader(key: str, stop: float) -> None:
            auth = {"Authorization": f"Bearer {key}"}
            while time.monotonic() < stop:
                await timed("upload", lambda: client.post(
                    "/files", headers=auth, files={"file": ("t.jsonl", io.BytesIO(UPLOAD))}, data={"purpose": "fine-tune"}))

        warm = time.monotonic() + 2
        await asyncio.gather(*(reader(i, warm) for i in range(8)))
        latencies.clear()
        errors.clear()
        failures.clear()
        started = time.monotonic()
        stop = started + seconds
        await asyncio.gather(*(reader(i, stop) for i in range(clients)), *(uploader(k, stop) for k in uploaders))
        elapsed = time.monotonic() - started

    routes = {
        route: {
            "requests": len(latencies[route]), "errors": errors[route],
            "rps": round(len(latencies[route]) / elapsed, 1),
            "p50_ms": round(_percentile(latencies[route], 0.50) * 1000, 1),
            "p99_ms": round(_percentile(latencies[route], 0.99) * 1000, 1),
        }
        for route in (*READS, "upload")
    }
    reads = sum(len(latencies[r]) for r in READS)
    return {"read_rps": round(reads / elapsed, 1), "errors": sum(errors.values()), "failures": dict(failures),
            "routes": routes}


def _wait_up(base_url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/models", timeout=5).status_code == 401:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{base_url} did not come up within {timeout_s} s")


def _side(base_url: str, settings: Settings, args) -> dict:
    reader_keys = _accounts(settings, READER_ACCOUNTS)
    upload_keys = _accounts(settings, args.uploaders)

    async def prepare() -> list[str]:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            return [await _prepare(client, key) for key in reader_keys]

    jobs = asyncio.run(prepare())
    return asyncio.run(_load(base_url, list(zip(reader_keys, jobs)), upload_keys, args.clients, args.seconds))


def serve_bare(port: int) -> None:
    """The same app on plain uvicorn (run as a subprocess of the bench: `--bare-port`)."""
    import uvicorn

    from serve_app.app import create_app

    # Serve's proxy keeps idle connections 90 s; uvicorn's default of 5 s would add reconnects (and
    # the client's races with them) to this side only.
    uvicorn.run(create_app(Settings()), host="127.0.0.1", port=port, log_level="warning", access_log=False,
                timeout_keep_alive=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--uploaders", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=None, help="api_replicas for the Serve side")
    parser.add_argument("--max-ongoing", type=int, default=None, help="api_max_ongoing_requests for the Serve side")
    parser.add_argument("--bare-only", action="store_true", help="measure bare uvicorn alone (no Ray)")
    parser.add_argument("--bare-port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_port:
        serve_bare(args.bare_port)
        return 0

    data_dir = Path(tempfile.mkdtemp(prefix="oftload-"))
    overrides = {k: v for k, v in {"api_replicas": args.replicas, "api_max_ongoing_requests": args.max_ongoing}.items() if v}
    settings = Settings(data_dir=data_dir, model_source="standin", **overrides)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "OPENFT_DATA_DIR": str(data_dir),
           "OPENFT_MODEL_SOURCE": "standin"}

    bare_port = free_port()
    bare = subprocess.Popen([sys.executable, __file__, "--bare-port", str(bare_port)], env=env, cwd=ROOT)
    try:
        bare_url = f"http://127.0.0.1:{bare_port}/v1"
        _wait_up(bare_url)
        bare_result = _side(bare_url, settings, args)
    finally:
        bare.terminate()
        bare.wait(30)
    if args.bare_only:
        print(json.dumps({"clients": args.clients, "uploaders": args.uploaders, "bare_uvicorn": bare_result}))
        return 0

    from entrypoints.ray_runtime import deploy_api, prepare_ray_environment, start_ray, stop_serving

    prepare_ray_environment(settings)
    start_ray(settings, dashboard=False)
    try:
        serve_url = deploy_api(settings, host="127.0.0.1", port=free_port())
        _wait_up(serve_url)
        serve_result = _side(serve_url, settings, args)
    finally:
        stop_serving(settings)

    ratio = round(serve_result["read_rps"] / bare_result["read_rps"], 2) if bare_result["read_rps"] else None
    retrieve_p99 = serve_result["routes"]["retrieve_job"]["p99_ms"]
    report = {
        "clients": args.clients, "uploaders": args.uploaders, "seconds": args.seconds,
        "api_replicas": settings.api_replicas, "api_max_ongoing_requests": settings.api_max_ongoing_requests,
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1),
        "serve": serve_result, "bare_uvicorn": bare_result, "serve_to_bare_read_rps": ratio,
        "targets": {
            "zero_errors": serve_result["errors"] == 0 and bare_result["errors"] == 0,
            "ratio_at_least_0.5": ratio is not None and ratio >= 0.5,
            "retrieve_p99_under_1s": retrieve_p99 < 1000,
        },
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
