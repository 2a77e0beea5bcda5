"""Ray Serve wrapper: one ingress deployment whose replicas each build the FastAPI app from the
`Settings` they are given (nothing is shared between replicas but the DB and object store)."""

from __future__ import annotations

from ray import serve

from openft.settings import Settings
from serve_app.app import create_app


@serve.deployment(name="openft-api", num_replicas=1, ray_actor_options={"num_cpus": 0})
@serve.ingress()
class OpenFTAPI:
    def __init__(self, settings: Settings):
        self.settings = settings

    def __serve_build_asgi_app__(self):
        return create_app(self.settings)


def build_app(settings: Settings):
    """The Serve application for `serve.run(...)`."""
    return OpenFTAPI.bind(settings)
