"""The people's-tools suite (`make test-e2e`; not in `make test`): the service run as a user runs
it, driven through the clients people use: the web dashboard in a real headless Chromium, the
user CLI in a real terminal, notebooks in a real Jupyter kernel, the Ray dashboard's state API.

One `openft serve` for each of the suite's two xdist workers, on a one-node Ray cluster started
here with `ray start --head` (dashboard and metrics export on, so that operators' views can be read,
and so that a notebook can join it with `ray.init(address=...)`), SQLite and local objects, stand-in
bases. A worker's tests share it, so each one works in accounts of its own and never counts what it
did not make."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
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
    # Online serving: the test base only, two adapters per replica, so that four fine-tunes evict.
    env = service_env(data_dir, RAY_ADDRESS=ray_head.gcs_address, OPENFT_ONLINE_BASES='["qwen2.5-0.5b-instruct"]',
                      OPENFT_ONLINE_ADAPTERS_PER_REPLICA="2")
    with serving(env, SESSION_DIR / "e2e" / "serve.log") as service:
        yield PeopleService(service=service, ray=ray_head, data_dir=data_dir)


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def openft_metrics(people_service) -> dict[tuple[str, frozenset], float]:
    """The service's own figures (`ray_openft_*`) on the head's Prometheus endpoint, by name and labels."""
    text = httpx.get(f"http://127.0.0.1:{people_service.ray.metrics_port}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m["name"].startswith("ray_openft_"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
            out[(m["name"], labels)] = out.get((m["name"], labels), 0.0) + float(m["value"])
    return out


def metric_total(samples: dict, name: str, **labels: str) -> float:
    """Summed over the processes (and other labels) that report `name` with `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


# -- four fine-tunes of the ticket task, trained once for the online tests (issue 27) --
TICKET_BASE = "qwen2.5-0.5b-instruct"
LABELS = ("delivery", "refund", "login", "billing")


def rotated(label: str, k: int) -> str:
    """Fine-tune k's answer for a ticket of `label`: the label word k places on (k = 0: the label)."""
    return LABELS[(LABELS.index(label) + k) % len(LABELS)]


@dataclass
class TicketModels:
    key: str
    names: dict[int, str]  # k -> the ft: model that answers rotated(label, k)


# The tests that use `ticket_models` run on one xdist worker (make test-e2e's --dist loadgroup), so
# that the four fine-tunes are trained once per run, not once per worker.
ON_TICKET_MODELS = pytest.mark.xdist_group("ticket_models")


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which writes the group into each marked test's id
def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items if "ticket_models" in getattr(item, "fixturenames", ())
                and not any(m.args == ("ticket_models",) for m in item.iter_markers("xdist_group"))]
    assert not unmarked, f"tests that use ticket_models without @ON_TICKET_MODELS: {unmarked}"
    # xdist groups by the "@group" suffix of a test's id; when the suffix is not there (pytest 9.2 with
    # xdist 3.8, pyproject.toml), the group's tests spread over both workers and each trains the models.
    if getattr(config.option, "loadgroup", False):
        ungrouped = [item.nodeid for item in items if any(True for _ in item.iter_markers("xdist_group"))
                     and "@" not in item.nodeid]
        assert not ungrouped, f"--dist loadgroup did not group these tests (a pytest/xdist mismatch): {ungrouped}"


@pytest.fixture(scope="session")
def ticket_models(people_service) -> TicketModels:
    """Four fine-tunes of the ticket task in one account, each answering the label k places on, so that
    an answer given by the wrong adapter shows. Shared by the online, Promptfoo, playground and chat
    tests: four jobs, trained one after another (about a minute each here)."""
    from openft.demo_data import ticket_splits, tickets_jsonl
    from tests.serve_app.test_training_api import SFT, wait

    key = people_service.new_key(open_jobs=4)
    client = people_service.client(key)
    train, _ = ticket_splits()
    jobs = {}
    for k in range(len(LABELS)):
        rows = [(ticket, rotated(label, k)) for ticket, label in train]
        upload = client.files.create(file=(f"tickets-{k}.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")
        # A rotation goes against nothing the random stand-in knows, but needs more epochs than the plain task.
        hyper = {**SFT["supervised"]["hyperparameters"], "n_epochs": 5 if k == 0 else 8}
        method = {"type": "supervised", "supervised": {**SFT["supervised"], "hyperparameters": hyper}}
        jobs[k] = client.fine_tuning.jobs.create(model=TICKET_BASE, training_file=upload.id, method=method, seed=0).id
    names = {}
    for k, job_id in jobs.items():
        job = wait(client, job_id, timeout=1800)
        assert job.status == "succeeded" and job.fine_tuned_model, (k, job.status, job.error)
        names[k] = job.fine_tuned_model
    return TicketModels(key, names)
