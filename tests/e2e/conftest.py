"""The people's-tools suite (`make test-e2e`; not in `make test`): the service run as a user runs
it, driven through the clients people use: the web dashboard in a real headless Chromium, the
user CLI in a real terminal, notebooks in a real Jupyter kernel, the Ray dashboard's state API.

One `openft serve` for the whole suite, on a one-node Ray cluster started here with `ray start
--head` (dashboard and metrics export on, so that operators' views can be read, and so that a
notebook can join it with `ray.init(address=...)`), SQLite and local objects, stand-in bases.
Tests share it, so each one works in accounts of its own and never counts what it did not make."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import SESSION_DIR, free_port
from tests.utils.polling import until
from tests.utils.service import Service, _kill_group, _start, _tail, ray_env, service_env, serving

RAY = str(Path(sys.executable).with_name("ray"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "e2e"  # screenshots and transcripts, kept after the run


@dataclass
class RayHead:
    gcs_address: str
    dashboard_url: str
    metrics_port: int
    process: subprocess.Popen
    log: Path


@dataclass
class PeopleService:
    """What the suite's tests get: the running service and the Ray cluster under it."""

    service: Service
    ray: RayHead
    data_dir: Path

    @property
    def base_url(self) -> str:  # the OpenAI base URL: http://127.0.0.1:<port>/v1
        return self.service.base_url

    def new_key(self, open_jobs: int = 3) -> str:
        name = f"acct-{uuid.uuid4().hex[:8]}"
        out = self.service.openft("accounts", "create", name, "--open-jobs", str(open_jobs))
        return out.strip().splitlines()[-1]

    def client(self, key: str):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def ray_head(seaweed):
    """A one-node Ray cluster of its own (2 CPUs, the machine's cores), in its own process group.
    `seaweed` first: its S3 credentials are in the environment every Ray worker inherits."""
    base = SESSION_DIR / "e2e"
    base.mkdir(exist_ok=True)
    port, dashboard_port, metrics_port = free_port(), free_port(), free_port()
    log = base / "head.log"
    process = _start([RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                      "--num-cpus=2", "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                      f"--dashboard-port={dashboard_port}", f"--metrics-export-port={metrics_port}",
                      f"--ray-client-server-port={free_port()}", f"--temp-dir={base / 'ray'}",
                      "--object-store-memory=268435456", "--disable-usage-stats"], log, ray_env())  # fmt: skip
    head = RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", metrics_port, process, log)

    def up() -> bool:
        assert process.poll() is None, "ray start --head exited:\n" + _tail(log)
        from ray.util.state import list_nodes

        try:
            return any(n.state == "ALIVE" for n in list_nodes(address=head.dashboard_url, limit=10))
        except Exception:  # not answering yet
            return False

    try:
        until(up, "the Ray head's dashboard", 180, interval=1)
        yield head
    finally:
        _kill_group(process)


@pytest.fixture(scope="session")
def people_service(ray_head: RayHead) -> PeopleService:
    data_dir = SESSION_DIR / "e2e" / "serve"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = service_env(data_dir, RAY_ADDRESS=ray_head.gcs_address)
    with serving(env, SESSION_DIR / "e2e" / "serve.log") as service:
        yield PeopleService(service=service, ray=ray_head, data_dir=data_dir)
