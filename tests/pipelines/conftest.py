"""One local Ray for the pipeline tests (joined, not restarted, if the session already has one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if ray.is_initialized():
        yield ray
        return
    # Ray 2.60 turns token auth on for every new local cluster and writes ~/.ray/auth_token;
    # a throwaway test cluster on 127.0.0.1 needs neither.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Short: Ray keeps unix sockets under it, and their paths are limited to 107 bytes.
    temp_dir = Path(f"/tmp/openft-ray-{os.getpid()}")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(temp_dir), address="local", log_to_driver=False)
    yield ray
    ray.shutdown()
