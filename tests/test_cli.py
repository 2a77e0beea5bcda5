"""The `openft` command as an operator runs it: accounts create, then serve until SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

from tests.conftest import free_port

OPENFT = [sys.executable, "-m", "entrypoints.cli"]


def _env() -> dict[str, str]:
    # A fresh operator shell: no Ray settings inherited from the test session's cluster.
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def test_accounts_create_then_serve_until_sigterm():
    data_dir = Path(tempfile.mkdtemp(prefix="oftcli-"))
    created = subprocess.run(
        [*OPENFT, "accounts", "create", "alice", "--data-dir", str(data_dir), "--open-jobs", "2"],
        capture_output=True, text=True, env=_env(), timeout=120, check=True,
    )
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-openft-") and "alice" not in key

    port = free_port()
    server = subprocess.Popen(
        [*OPENFT, "serve", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, "openft serve exited early:\n" + "".join(lines[-30:])
            lines.append(line)
            if line.startswith("openft API:"):
                break
        base_url = line.split(": ", 1)[1].strip()
        assert base_url == f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        assert client.files.list().data == []
        assert (data_dir / "ray_auth_token").exists()
        assert (data_dir / "openft.db").exists()
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=120)
        assert server.returncode == 0, "".join(lines) + out
        assert "Ray dashboard: http://" in "".join(lines) + out
    finally:
        if server.poll() is None:
            server.kill()
