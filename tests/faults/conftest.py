"""Fault injection with real processes: each test runs real stand-in training on Ray Train and
breaks something real mid-run (a process group, an actor, a Train worker, PostgreSQL, the S3
server). `make test-faults` runs them, two at a time; `make test` does not (14 minutes here)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

# Every process this run starts inherits this variable (Ray's raylet and its workers included: they
# are spawned with their parent's environment), and no other suite's does: .ci/run runs the fault
# suite beside another, and a fault must only ever find and kill this run's processes.
RUN_MARK = "OFT_FAULTS_RUN"
os.environ[RUN_MARK] = f"{os.getpid()}-{uuid.uuid4().hex}"

@pytest.fixture
def service(apis):
    """A deployment of its own plus its controller actor: service(name, controller=None, **settings)
    -> (api, handle).
    Short leases so that a lost run is reconciled within seconds."""
    import ray

    from worker.controller import start_controller

    made, names = [], []

    def make(name: str, controller: dict | None = None, **overrides):
        # The serving-parity check (its own tests: tests/train/test_parity.py, the SFT job) is off:
        # these tests are about a run's recovery, and its Ray task adds a model load to every job.
        api = apis(f"{name}-{uuid.uuid4().hex[:6]}", **{"run_lease_seconds": 5, "parity_check": False, **overrides})
        # `controller`: settings the controller runs with where they differ from the API's.
        handle = start_controller(api.settings.model_copy(update=controller or {}), name=f"ctl-{api.name}")
        made.append(handle)
        names.append(api.name)
        return api, handle

    yield make
    from ray import serve

    for handle in made:
        try:
            ray.get(handle.stop.remote(), timeout=30)
        except Exception:  # killed by the test and not restarted
            pass
        ray.kill(handle)
    for api_name in names:
        serve.delete(api_name)  # its replicas would otherwise stay up for the rest of the session
    assert_cluster_at_rest()


def assert_cluster_at_rest(timeout: float = 60) -> None:
    """Every fault ends with the cluster's resources free again: no placement group and no worker
    still holds CPU once the test's runs are over. A run that leaked them would leave the next job
    waiting for a Train worker that can never be placed (the session's cluster has 2 CPUs)."""
    import ray

    def leftovers() -> dict:
        held = {pg: info["state"] for pg, info in ray.util.placement_group_table().items()
                if info["state"] not in ("REMOVED",)}
        free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
        return {"placement_groups": held, "cpu_free": free, "cpu_total": total}

    deadline = time.monotonic() + timeout
    while True:
        now = leftovers()
        if not now["placement_groups"] and now["cpu_free"] == now["cpu_total"]:
            return
        if time.monotonic() > deadline:
            said = f"the cluster is not at rest {timeout:.0f} s after the test: {now}; " \
                   f"creators: {_creators(now['placement_groups'])}"
            # This test fails; the next ones must not fail with it. A group left here would hold
            # one of the session's 2 CPUs for every later test, whose jobs then wait for a core.
            from train.placement import remove_placement_group

            for pg_hex in now["placement_groups"]:
                remove_placement_group(pg_hex)
            raise AssertionError(said)
        time.sleep(0.5)


def _creators(held: dict) -> dict:
    """What made each held placement group, and whether the GCS counts that creator dead: the
    difference between a group nothing can free (a live creator) and one the controller's sweep
    of orphans should have removed."""
    import ray

    from train.placement import gcs_placement_groups

    out = {}
    for group in gcs_placement_groups():
        pg_hex = group.placement_group_id.hex()
        if pg_hex in held:
            actor = ray.ActorID(group.creator_actor_id)
            info = {} if actor.is_nil() else (ray._private.state.actors(actor.hex()) or {})
            out[pg_hex] = {"creator_actor": None if actor.is_nil() else actor.hex(),
                           "creator_dead": group.creator_actor_dead, "creator_job": group.creator_job_id.hex(),
                           "class": info.get("ActorClassName"), "state": info.get("State"),
                           "name": group.name}
    return out


def processes_matching(text: str) -> list[int]:
    """Pids of this run's processes (RUN_MARK) whose command line contains `text` (Ray names its
    workers' processes `ray::<Class>...`)."""
    mark = f"{RUN_MARK}={os.environ[RUN_MARK]}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if text in cmdline and mark in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def train_worker_pid(timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = processes_matching("ray::RayTrainWorker")
        if len(pids) == 1:
            return pids[0]
        time.sleep(0.2)
    raise AssertionError(f"no single Ray Train worker process within {timeout} s")


def kill(pid: int, sig=signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class PrivatePostgres:
    """A PostgreSQL server of one test's own (initdb in a temporary directory, a free port on
    127.0.0.1, trust auth), so that restarting it breaks only that test's service: the fault suite
    runs two tests at a time, and the machine's shared server (127.0.0.1:5432) serves the other."""

    def __init__(self, root: Path, port: int):
        import glob

        self.bin = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1])
        self.root, self.port = root, port
        self.data = root / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def _pg(self, tool: str, *args: str) -> None:
        import subprocess

        # PostgreSQL refuses to run as root: its own user runs it, as the Debian cluster does.
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bin / tool), *args], check=True, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @property
    def _options(self) -> str:
        return f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"

    def _ctl(self, action: str, *args: str) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.root / "log"), action, *args)

    def start(self) -> "PrivatePostgres":
        import shutil

        shutil.chown(self.root, "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        self._ctl("start", "-o", self._options)
        return self

    def restart(self) -> None:
        """As `pg_ctlcluster ... restart` does: a fast shutdown (every connection cut), then a start."""
        self._ctl("restart", "-m", "fast", "-o", self._options)

    def stop(self) -> None:
        self._ctl("stop", "-m", "immediate")


@pytest.fixture
def private_pg():
    """PrivatePostgres, started; stopped after the test."""
    import shutil

    if not shutil.which("runuser") or not Path("/usr/lib/postgresql").is_dir():
        pytest.skip("the PostgreSQL server binaries (Debian's postgresql) are not installed")
    from tests.conftest import free_port

    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="oftpg-")), free_port()).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
