"""`openft serve` joining the three-node cluster with the laptop's defaults (SQLite, the data dir's
objects directory) is refused at start, naming both settings: the worker nodes' Train workers and
tasks could not reach either on the head's disk (entrypoints/preflight.py `shared_disk_problems`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cluster.conftest import SESSION_DIR, service_env
from tests.conftest import free_port

pytestmark = pytest.mark.cluster


def test_state_on_the_heads_disk_is_refused_on_a_cluster(cluster):
    data_dir = SESSION_DIR / "serve-defaults"
    data_dir.mkdir()
    env = service_env(data_dir, RAY_ADDRESS=cluster.gcs_address)
    done = subprocess.run([sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "OPENFT_DATABASE_URL: the cluster has 3 nodes" in done.stderr
    assert "OPENFT_STORAGE_URL: the cluster has 3 nodes" in done.stderr
    assert "openft API:" not in done.stdout  # nothing was deployed
