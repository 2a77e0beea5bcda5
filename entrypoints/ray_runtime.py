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
import tempfile
from pathlib import Path

from openft.settings import Settings

# Ray puts unix sockets under its temp dir; their paths must stay under the kernel's 107 bytes.
_MAX_TEMP_DIR = 60


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

    if ray.is_initialized():
        return ray.get_runtime_context()
    # Ray Data's progress bars go to the driver's stderr; keep operator logs readable.
    if settings.ray_address:
        return ray.init(address=settings.ray_address, log_to_driver=False)
    temp_dir = ray_temp_dir(settings)
    temp_dir.mkdir(parents=True, exist_ok=True)
    return ray.init(
        num_cpus=num_cpus,
        include_dashboard=dashboard,
        dashboard_host=host,
        _temp_dir=str(temp_dir),
        log_to_driver=False,
    )


def deploy_api(settings: Settings, *, host: str, port: int, name: str = "openft", route_prefix: str = "/"):
    """Deploy the API as a Serve application; returns its base URL (ending in /v1)."""
    from ray import serve

    from serve_app.deployment import build_app

    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(settings), name=name, route_prefix=route_prefix, blocking=False)
    prefix = "" if route_prefix == "/" else route_prefix
    return f"http://{host}:{port}{prefix}/v1"
