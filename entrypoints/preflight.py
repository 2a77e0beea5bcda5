"""Configuration checks that run before Ray starts (`openft serve`, `openft demo`), and the one that
needs the cluster (`check_cluster`, once Ray is up: can it ever place a job's Train workers?).

A bad database URL, storage URL or object directory otherwise surfaces only in a Serve replica's
log, after Ray has started and Serve has retried the deployment for some 40 s ("Deploying
application openft failed"). Each check here answers within `preflight_timeout_seconds` and
names the setting at fault; what it prints is configuration (URLs with their passwords masked,
the driver's or the OS's one-line reason), never anything a user sent.
"""

from __future__ import annotations

import threading
from typing import Callable

from openft.settings import Settings


def check_configuration(settings: Settings) -> list[str]:
    """Problems that would keep the API from starting; empty when it can start."""
    problems = [
        _prices(settings),
        _online_bases(settings),
        _within(settings.preflight_timeout_seconds, "OPENFT_DATABASE_URL: the database", lambda: _database(settings)),
        _within(settings.preflight_timeout_seconds, "OPENFT_STORAGE_URL: the object store", lambda: _object_store(settings)),
    ]
    return [p for p in problems if p]


def _prices(settings: Settings) -> str | None:
    from catalog.bases import unpriced

    missing = unpriced(settings.prices.rates)
    return f"OPENFT_PRICES: the price table has no rate for: {', '.join(missing)}" if missing else None


def _online_bases(settings: Settings) -> str | None:
    from catalog.bases import not_servable

    wrong = not_servable(settings.online_bases)
    return f"OPENFT_ONLINE_BASES: not a servable base of the catalog: {', '.join(wrong)}" if wrong else None


def check_cluster(settings: Settings) -> list[str]:
    """Problems with the connected cluster's nodes that no job could get past (`train_num_workers`
    workers of `train_worker_resources` that no set of nodes places): refused at start, not after a
    job has tokenized. Ray must be initialised. Judged on the nodes alive now: a cluster that
    autoscales its training nodes from zero must start with the resources declared."""
    import ray

    from jobs.scheduling import placement_problem

    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    problem = placement_problem(settings, nodes)
    return ([f"OPENFT_TRAIN_NUM_WORKERS: {problem}"] if problem else []) + shared_disk_problems(settings, len(nodes))


def shared_disk_problems(settings: Settings, node_count: int) -> list[str]:
    """On a cluster of several nodes, the settings that would put state on the head's own disk:
    Train workers, Ray Data tasks and merge tasks on the other nodes write events, rows and objects
    through the database and the store, and a SQLite file or the data dir's default objects
    directory is not there for them. An explicit file:// store is the operator's statement that the
    directory is one every node mounts at that path, so it passes; SQLite has no safe shared mount."""
    if node_count <= 1:
        return []
    problems = []
    if settings.resolved_database_url().startswith("sqlite"):
        problems.append(f"OPENFT_DATABASE_URL: the cluster has {node_count} nodes and SQLite is a file on this "
                        "node's disk that the others cannot reach; set a PostgreSQL URL")
    if settings.storage_url is None:
        problems.append(f"OPENFT_STORAGE_URL: the cluster has {node_count} nodes and the default object store is "
                        f"a directory on this node's disk ({settings.resolved_storage_url()}); set an s3:// URL, "
                        "or a file:// directory that every node mounts at the same path")
    return problems


def _database(settings: Settings) -> str | None:
    from storage.db import describe_url, ping

    url = settings.resolved_database_url()
    try:
        ping(url, settings.preflight_timeout_seconds)
    except Exception as exc:  # any failure to connect is the finding; it is reported, not raised
        return f"OPENFT_DATABASE_URL: cannot connect to {describe_url(url)}: {_reason(exc)}"
    return None


def _object_store(settings: Settings) -> str | None:
    from storage.objects import check_storage_url, open_object_store, probe_writable

    url = settings.resolved_storage_url()
    try:
        check_storage_url(url)
    except ValueError as exc:
        return f"OPENFT_STORAGE_URL: {exc}"
    try:
        probe_writable(open_object_store(url, s3_endpoint_url=settings.s3_endpoint_url, s3_region=settings.s3_region))
    except Exception as exc:  # a read-only directory, a missing bucket, refused credentials: reported
        return f"OPENFT_STORAGE_URL: cannot write to {url}: {_reason(exc)}"
    return None


def _reason(exc: BaseException) -> str:
    """One line naming the failure: a DB-API error's own first line (SQLAlchemy's wrapper adds the
    SQL and a link), else the exception's class and first line."""
    inner = getattr(exc, "orig", None) or exc
    text = (str(inner).strip().splitlines() or [""])[0]
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


def _within(timeout_s: float, what: str, check: Callable[[], str | None]) -> str | None:
    """`check()`, or a finding that `what` did not answer in time: a host that drops packets
    would otherwise hold the start for the driver's own (minutes-long) connect timeout."""
    result: list[str | None] = []
    # A daemon thread: one stuck in connect() must not keep the process from exiting.
    worker = threading.Thread(target=lambda: result.append(check()), daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return f"{what} did not answer within {timeout_s:g} s; check its address and that it is up"
    return result[0]
