"""A real multi-node Ray cluster on this machine (`make test-cluster`; not in `make test`).

One head node (`ray start --head`, no CPU, no training resource, dashboard on for the state API)
and two worker nodes, each a `ray start --address ... --block` of its own inside its own mount
namespace (`unshare --mount --propagation private`, root) with a private tmpfs over the session
dir, which holds the service's data dirs (and so their model caches), the worker nodes' Ray temp
dirs and their TMPDIR. The nodes share only the network, the PostgreSQL on 127.0.0.1:5432 and the session's
SeaweedFS S3 server, as the nodes of a real cluster do. A worker node's tmpfs lives only in its
namespace, which ends with its last process: there is nothing to unmount.

Only the processes started here are stopped, each node by its own process group (Ray starts its
raylet and workers in the group of `ray start`), never by name: other Ray clusters run on this machine.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from tests.conftest import SESSION_DIR, _new_pg_database, free_port
from tests.utils.polling import until
from tests.utils.service import Service, _kill_group, _start, _tail, ray_env, s3_settings, service_env, serving  # noqa: F401

RAY = str(Path(sys.executable).with_name("ray"))
# Each worker node: two logical CPUs on the machine's two cores (a train worker and the Ray Data
# tasks that feed it fit on one node), and room for two train workers, so that a 2-worker job
# still fits when one node is lost.
WORKERS = {"node_a": {"CPU": 2, "trainer": 2}, "node_b": {"CPU": 2, "trainer": 2}}
OBJECT_STORE_BYTES = 256 * 1024**2


@dataclass
class Node:
    name: str
    process: subprocess.Popen
    log: Path


@dataclass
class Cluster:
    gcs_address: str
    dashboard_url: str
    nodes: dict[str, Node] = field(default_factory=dict)

    def node_names(self) -> dict[str, str]:
        """Ray node id -> "head" or the worker node's name (from its custom resource), live or dead."""
        from ray.util.state import list_nodes

        names = {}
        for node in list_nodes(address=self.dashboard_url, limit=100, detail=True):
            total = node.resources_total or {}
            names[node.node_id] = "head" if node.is_head_node else next((n for n in WORKERS if n in total), "?")
        return names

    def alive(self) -> set[str]:
        from ray.util.state import list_nodes

        return {n.node_id for n in list_nodes(address=self.dashboard_url, limit=100) if n.state == "ALIVE"}

    def kill_node(self, name: str) -> None:
        """SIGKILL a worker node's whole process group (`ray start`, its raylet and every worker)."""
        _kill_group(self.nodes[name].process)


def _ports(*names: str) -> list[str]:
    return [f"--{name}={free_port()}" for name in names]


def _node_ports() -> list[str]:
    # Fixed defaults (the agent's 52365 and others) would collide between nodes on one machine.
    return _ports("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                  "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")  # fmt: skip


@pytest.fixture(scope="session")
def cluster(seaweed):
    # The worker nodes' tmpfs covers the session dir (every data dir and model cache of the suite, and
    # their Ray temp dirs and TMPDIR), not all of /tmp: a checkout, its venv or another cluster may be there.
    tmp = SESSION_DIR.resolve()
    base = SESSION_DIR / "cluster"
    base.mkdir()
    env = ray_env()
    port, dashboard_port = free_port(), free_port()
    head_log = base / "head.log"
    head = _start([RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                   "--num-cpus=0", "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                   f"--dashboard-port={dashboard_port}", f"--temp-dir={base / 'head-ray'}",
                   f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
                   *_ports("ray-client-server-port"), *_node_ports()], head_log, env)  # fmt: skip
    made = Cluster(gcs_address=f"127.0.0.1:{port}", dashboard_url=f"http://127.0.0.1:{dashboard_port}")
    made.nodes["head"] = Node("head", head, head_log)
    try:
        until(lambda: _dashboard_up(made), "the head node's dashboard", 180, interval=1)
        for name, resources in WORKERS.items():
            made.nodes[name] = _start_worker(made, name, resources, tmp, base, env)
        try:
            until(lambda: _joined(made), "the worker nodes to join", 300, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n" + "\n".join(f"{n.name}: {_tail(n.log, 15)}" for n in made.nodes.values()))
        yield made
    finally:
        for node in reversed(list(made.nodes.values())):
            _kill_group(node.process)


def _dashboard_up(cluster: Cluster) -> bool:
    assert cluster.nodes["head"].process.poll() is None, "ray start --head exited:\n" + _tail(cluster.nodes["head"].log)
    try:
        return bool(cluster.alive())
    except Exception:  # not answering yet
        return False


def _joined(cluster: Cluster) -> bool:
    for node in cluster.nodes.values():
        assert node.process.poll() is None, f"the {node.name} node's ray start exited:\n{_tail(node.log)}"
    return len(cluster.alive()) == len(cluster.nodes)


def _start_worker(cluster: Cluster, name: str, resources: dict, tmp: Path, base: Path, env: dict) -> Node:
    """`ray start --block` inside a mount namespace of its own with a fresh tmpfs over the session dir.
    The auth token (a cluster secret, as a Kubernetes secret would be) is copied into it first."""
    import json

    token = env["RAY_AUTH_TOKEN_PATH"]
    custom = {name: 1, **{k: v for k, v in resources.items() if k != "CPU"}}  # its name: to place and find work
    start = [RAY, "start", "--block", f"--address={cluster.gcs_address}", "--node-ip-address=127.0.0.1",
             f"--num-cpus={resources['CPU']}", "--num-gpus=0", f"--resources={json.dumps(custom)}",
             f"--temp-dir={tmp / f'ray-{name}'}", f"--object-store-memory={OBJECT_STORE_BYTES}",
             "--disable-usage-stats", *_node_ports()]  # fmt: skip
    script = (
        'set -e; token=$(cat "$1"); shift; mount -t tmpfs -o mode=1777 "openft-$NODE" "$TMPROOT"; '
        'mkdir -p "$(dirname "$TOKEN")" "$TMPDIR"; (umask 077; printf %s "$token" > "$TOKEN"); exec "$@"'
    )
    log = base / f"{name}.log"  # opened before the mount: the log stays readable from here
    # TMPDIR: the temp files of the node's Ray workers (tempfile) stay on its own tmpfs too.
    node_env = {**env, "NODE": name, "TMPROOT": str(tmp), "TOKEN": token, "TMPDIR": str(tmp / f"tmp-{name}")}
    process = _start(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", token,
                      *start], log, node_env)  # fmt: skip
    return Node(name, process, log)


@pytest.fixture(scope="session")
def cluster_bucket(seaweed) -> str:
    bucket = f"cluster-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return bucket


def cluster_service_env(cluster: Cluster, name: str, database_url: str, seaweed, bucket: str, **settings: str) -> dict:
    """`openft serve` on the head of `cluster`: PostgreSQL, S3 under `name`/, a data dir of its own
(the same path on every node: each worker node's tmpfs gives it an empty one)."""
    data_dir = SESSION_DIR / f"serve-{name}"
    data_dir.mkdir()
    return service_env(data_dir, RAY_ADDRESS=cluster.gcs_address, OPENFT_DATABASE_URL=database_url,
                       **s3_settings(seaweed, bucket, name), **settings)  # fmt: skip


@pytest.fixture(scope="session")
def cluster_db():
    with _new_pg_database("openft_cluster") as url:
        yield url
