"""Starting or joining Ray, and deploying the API on Ray Serve.

Auth decision: a local cluster started here runs Ray's token auth (Ray 2.60's default), with the
token kept in the data dir (`ray_auth_token`, mode 0600) instead of ~/.ray, so the dashboard and
the cluster's ports on 127.0.0.1 are not open to other local users. Joining `RAY_ADDRESS` uses
whatever the operator's environment configures for that cluster.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import sys
import tempfile
import threading
from pathlib import Path

from openft.settings import Settings

# Beyond the replicas' grace, what Serve's controller takes to stop its proxy and itself.
SERVE_STOP_MARGIN_S = 2.0

# Ray puts unix sockets under its temp dir; their paths must stay under the kernel's 107 bytes.
_MAX_TEMP_DIR = 60

# A local node's upkeep, read by Ray's processes from their environment at start (a node started here
# inherits this process's; `ray start` takes them from the operator's shell). Serve's controller runs
# its control loop every 0.1 s by default, and Ray's log monitor lists the session's log files every
# 0.1 s to publish worker output to drivers, which this service does not read (log_to_driver is off).
# Every 0.5 s and every 5 s instead, an idle `openft serve` spent 13.4 CPU-s a minute against 20.9
# (bench/idle_cluster.py, 2 rounds on a loaded machine; Serve's controller about 4x less);
# requests never wait on the control loop (it scales and heals deployments), and the Ray dashboard
# reads log files itself.
LOCAL_RAY_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
                 "LOG_NAME_UPDATE_INTERVAL_S": "5"}


def ray_temp_dir(settings: Settings) -> Path:
    path = settings.ray_temp_dir
    if len(str(path)) > _MAX_TEMP_DIR:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
        path = Path(tempfile.gettempdir()) / f"openft-ray-{digest}"
    return path


def prepare_ray_environment(settings: Settings) -> None:
    """Must run before `import ray`: Ray's core reads its auth settings once, at import."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return
    token_path = settings.data_dir.resolve() / "ray_auth_token"
    if not token_path.exists():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    # Ray reads these from the environment only (they are inherited by every worker it starts).
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)


def start_ray(settings: Settings, *, dashboard: bool = True, num_cpus: int | None = None, host: str = "127.0.0.1"):
    """Join `settings.ray_address` or start a local Ray whose files live under the data dir."""
    if not settings.ray_address:
        prepare_ray_environment(settings)
    import ray

    from entrypoints import serve_proxy

    if ray.is_initialized():
        return ray.get_runtime_context()
    # No job-wide runtime_env: a worker process started for a runtime_env goes through Ray's
    # setup_worker.py, a second Python start, which doubled each actor's start-up CPU (0.98 s against
    # 0.49, /tmp probe of 8 trivial actors); this service starts hundreds (Train's controller, workers
    # and helpers for every run). The one switch it set that way, Ray Train's state tracking, is set
    # where Ray Train reads it (train/launcher.py).
    # log_to_driver off: Ray Data's progress bars go to the driver's stderr; keep operator logs readable.
    if settings.ray_address:
        return ray.init(address=settings.ray_address, log_to_driver=False)
    temp_dir = ray_temp_dir(settings)
    temp_dir.mkdir(parents=True, exist_ok=True)
    # Read by each Serve proxy this cluster starts (its processes inherit the environment): request
    # heads are bounded while the proxy parses them.
    os.environ.setdefault(serve_proxy.ENV, serve_proxy.HOOK)
    for name, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(name, value)
    return ray.init(
        num_cpus=num_cpus,
        include_dashboard=dashboard,
        dashboard_host=host,
        _temp_dir=str(temp_dir),
        log_to_driver=False,
        # Most of a local node's worker processes are long-lived actors (Serve's controller, proxy
        # and replicas, the job controller, Train's controller and workers, Ray Data's actors), about
        # ten on a laptop. Ray expects at most 4x its startup concurrency (the CPU count, so 8 on two
        # cores) and otherwise prints a warning meant for runaway task fan-out.
        _system_config={"worker_maximum_startup_concurrency": max(4, num_cpus or os.cpu_count() or 1)},
    )


def deploy_api(settings: Settings, *, host: str, port: int, name: str = "openft", route_prefix: str = "/"):
    """Deploy the API as a Serve application; returns its base URL (ending in /v1)."""
    from ray import serve

    from serve_app.deployment import build_app

    # One proxy, on the head beside the replicas (openft/head_node.py): a proxy on each worker node
    # would bind the same host:port there, which nodes sharing one address (or a firewall) refuse.
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    serve.run(build_app(settings), name=name, route_prefix=route_prefix, blocking=False)
    prefix = "" if route_prefix == "/" else route_prefix
    return f"http://{host}:{port}{prefix}/v1"


def stop_serving(settings: Settings) -> None:
    """Stop Serve, giving requests in flight `shutdown_grace_seconds`, then Ray.

    `serve.shutdown()` waits up to 30 s for Serve's controller, and when the controller cannot
    finish (a SIGTERM sent to the whole process group, as systemd and a terminal's Ctrl-C do, also
    reaches Ray's own processes, and Ray retries the call on a dying node) that wait was most of
    the 45 s a SIGTERM took. It runs in a thread of its own and is abandoned past the grace:
    `ray.shutdown()` stops every process of a local cluster either way."""
    import ray
    from ray import serve

    done = threading.Event()

    def _stop_serve() -> None:
        try:
            serve.shutdown()
        except Exception as exc:  # Ray already going: ray.shutdown() below still stops what is left
            print(f"openft: stopping Serve failed: {type(exc).__name__}", file=sys.stderr, flush=True)
        finally:
            done.set()

    threading.Thread(target=_stop_serve, name="openft-serve-shutdown", daemon=True).start()
    if not done.wait(settings.shutdown_grace_seconds + SERVE_STOP_MARGIN_S):
        print("openft: Serve did not stop in time; stopping Ray", file=sys.stderr, flush=True)
    ray.shutdown()


def descendants(root: int | None = None) -> list[tuple[int, str]]:
    """The descendants of `root` (default: this process) as (pid, start time) (Linux; empty elsewhere): a local Ray's raylet,
    GCS and dashboard are its children and every worker is the raylet's. Taken before shutdown
    starts, since a worker whose raylet has died is re-parented and no longer found from here."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found, todo = [], [root or os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def kill_leftovers(processes: list[tuple[int, str]]) -> None:
    """SIGKILL those of `processes` still running (the same pid and start time: not a reused pid)."""
    for pid, started in processes:
        try:
            if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19] == started:
                os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            continue  # already gone
