"""Real processes for suites that run the service as a user does: `openft serve` (and the Ray nodes
under it) in process groups of their own, stopped by group, never by name (other Ray clusters run
on this machine). Shared by the cluster suite (tests/cluster) and the people's-tools suite (tests/e2e)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from entrypoints.ray_runtime import LOCAL_RAY_ENV
from tests.conftest import RATE_LIMITS_OFF, free_port

def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)  # fmt: skip


def ray_env() -> dict[str, str]:
    """What every process of the cluster inherits: Ray's token auth (tests/conftest.py prepared the
    token) and the S3 credentials (the `seaweed` fixture), nothing of any other Ray cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OPENFT_"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=os.environ["RAY_AUTH_TOKEN_PATH"], RAY_USAGE_STATS_ENABLED="0",
               **LOCAL_RAY_ENV)
    return env


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Service:
    env: dict[str, str]
    base_url: str
    process: subprocess.Popen
    log: Path

    def openft(self, *args: str) -> str:
        return subprocess.run([sys.executable, "-m", "entrypoints.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=180, check=True).stdout  # fmt: skip

    def new_key(self) -> str:
        name = f"acct-{uuid.uuid4().hex[:8]}"
        return self.openft("accounts", "create", name, "--open-jobs", "3").strip().splitlines()[-1]


def service_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """`openft serve`'s environment: stand-in bases, quick controller passes, rate limits off, every
    upload and training file above 1 KiB validated, tokenized and read by Ray Data (so that those
    stages run on the cluster, and the Ray dashboard lists their datasets)."""
    env = ray_env()
    env.update(OPENFT_DATA_DIR=str(data_dir), OPENFT_MODEL_SOURCE="standin", OPENFT_CONTROLLER_POLL_SECONDS="0.5",
               OPENFT_VALIDATE_RAY_THRESHOLD_BYTES="1024", OPENFT_TOKENIZE_RAY_THRESHOLD_BYTES="1024",
               **{f"OPENFT_{k.upper()}": str(v) for k, v in RATE_LIMITS_OFF.items()})  # fmt: skip
    env.update(settings)
    return env


def s3_settings(seaweed, bucket: str, prefix: str) -> dict[str, str]:
    return {"OPENFT_STORAGE_URL": f"s3://{bucket}/{prefix}", "OPENFT_S3_ENDPOINT_URL": seaweed.endpoint_url}


@contextmanager
def serving(env: dict[str, str], log: Path):
    """`openft serve` in a process group of its own; stopped by SIGTERM, then its group is killed
    (with a local Ray, started by it, in the same group)."""
    port = free_port()
    out = open(log, "w")
    process = subprocess.Popen([sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(port)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        base_url = _wait_for_api(process, out)
        yield Service(env, base_url, process, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(process)
        out.close()


def _wait_for_api(process: subprocess.Popen, out) -> str:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            out.flush()
            raise AssertionError(f"openft serve exited; its output is in {out.name}")
        out.write(line)
        if line.startswith("openft API:"):
            # Keep copying its output, so that the pipe never fills and blocks the server.
            threading.Thread(target=shutil.copyfileobj, args=(process.stdout, out), daemon=True).start()
            return line.split(": ", 1)[1].strip()
    raise AssertionError("openft serve did not start within 300 s")


