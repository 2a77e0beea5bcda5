"""Ray Serve wrapper: one ingress deployment whose replicas each build the FastAPI app from the
`Settings` they are given (nothing is shared between replicas but the DB and object store).

Sizing (issue 12). Ray Serve's default of 5 ongoing requests per replica made list and retrieve
calls queue in the proxy behind uploads, which hold their slot for the whole transfer, and the
proxy's retry backoff then collapsed throughput (9 req/s at 64 clients). A replica is one asyncio
loop plus a 40-thread pool (FastAPI runs the sync handlers there), so it takes
`api_max_ongoing_requests` (default 128) at once and queues the excess itself, in order, instead of
in the proxy. `api_replicas` adds processes for CPU: the GIL, not the slot count, bounds one replica.

Why not a separate deployment for uploads and creates: Serve routes HTTP by path prefix to an
application's ingress, and `POST /v1/files` shares its path with `GET /v1/files`, so splitting
heavy from light would need an ingress that forwards request bodies over a deployment handle: a
second hop for every upload byte. The heavy work is already off the request path instead (large
files are validated by Ray Data tasks, training by the controller), and slow bodies are cut off by
`serve_app.slow_clients`, so a slot held by an upload is a slot among 128, not one of 5.
"""

from __future__ import annotations

from ray import serve

from openft.head_node import HEAD_NODE_RESOURCES
from openft.settings import Settings
from serve_app.app import create_app
from serve_app.state import AppState

# How often a stopping replica checks whether its requests have finished (Serve's default: 2 s).
_SHUTDOWN_POLL_S = 0.2


@serve.deployment(name="openft-api", ray_actor_options={"num_cpus": 0, "resources": HEAD_NODE_RESOURCES})
@serve.ingress()
class OpenFTAPI:
    def __init__(self, settings: Settings, online: dict | None = None):
        self.settings, self.online = settings, online or {}

    def __serve_build_asgi_app__(self):
        return create_app(self.settings, AppState.from_settings(self.settings, online=dict(self.online)))


def build_app(settings: Settings):
    """The Serve application for `serve.run(...)`, sized by the settings: the API, and beside it one
    deployment per base served online (online/deployment.py), whose handles the API calls."""
    from online.deployment import online_deployments

    return OpenFTAPI.options(
        num_replicas=settings.api_replicas,
        max_ongoing_requests=settings.api_max_ongoing_requests,
        graceful_shutdown_timeout_s=settings.shutdown_grace_seconds,
        graceful_shutdown_wait_loop_s=_SHUTDOWN_POLL_S,
    ).bind(settings, online_deployments(settings))
