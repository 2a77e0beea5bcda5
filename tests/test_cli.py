"""The `openft` command as an operator runs it: accounts create, then serve until SIGTERM.

The SIGTERM goes to the whole process group, as systemd and a terminal's Ctrl-C send it, so Ray's
own processes get it too, with uploads in flight: that took 45 s before issue 12 (Serve's
controller call retried on a dying node, "Controller failed to shut down within 30.0s")."""

from __future__ import annotations

import pytest

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

from entrypoints.ray_runtime import descendants
from tests.conftest import free_port
from tests.utils.slow_upload import SlowUpload

OPENFT = [sys.executable, "-m", "entrypoints.cli"]
SIGTERM_BOUND_S = 10  # issue 12's requirement, and the test's bound: a generous one on this machine


def _running(pid: int, started: str) -> bool:
    """The same process (pid and start time) is still running, not a zombie awaiting its reaper."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return str(pid)


def _env() -> dict[str, str]:
    # A fresh operator shell: no Ray settings inherited from the test session's cluster.
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def readme_serve_environment() -> dict[str, str]:
    """The variables the README's first `openft serve` line sets (`NAME=value openft serve`)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "openft serve" in line and not line.startswith(("#", "|")))
    words = line.split("#", 1)[0].split()
    return dict(word.split("=", 1) for word in words[: words.index("openft")])


def test_the_readmes_first_serve_line_names_the_offline_model_source():
    from openft.settings import Settings

    assert readme_serve_environment() == {"OPENFT_MODEL_SOURCE": "standin"}
    assert Settings().model_source == "hub"  # what the README says the default is, and why the line sets it


@pytest.mark.heavy  # make test-heavy: beyond make test's budget
def test_accounts_create_then_serve_until_sigterm():
    # The README's two first commands as written, from one directory: no --data-dir on either, so
    # both use the one default (./.openft), and each names it; the key then works on that server.
    workdir = Path(tempfile.mkdtemp(prefix="oftcli-"))
    data_dir = workdir / ".openft"
    env = {**_env(), **readme_serve_environment()}
    created = subprocess.run(
        [*OPENFT, "accounts", "create", "alice", "--open-jobs", "2"],
        capture_output=True, text=True, env=_env(), timeout=120, check=True, cwd=workdir,
    )
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-openft-") and "alice" not in key
    assert f"openft: data dir {data_dir} (from default)" in created.stderr

    port = free_port()
    server = subprocess.Popen(
        [*OPENFT, "serve", "--port", str(port)], cwd=workdir,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
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
        assert f"openft: data dir {data_dir} (from default)" in "".join(lines)
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        assert client.files.list().data == []
        assert any(m.id == "qwen2.5-0.5b-instruct" for m in client.models.list().data)  # offline: the stand-ins
        assert (data_dir / "ray_auth_token").exists()
        assert (data_dir / "openft.db").exists()
        in_flight = [SlowUpload(base_url, key).start() for _ in range(3)]
        time.sleep(1)
        ray_processes = descendants(server.pid)
        assert ray_processes, "no Ray processes under openft serve"

        signalled = time.monotonic()
        os.killpg(server.pid, signal.SIGTERM)
        out, _ = server.communicate(timeout=120)
        took = time.monotonic() - signalled
        assert server.returncode == 0, "".join(lines) + out
        assert took < SIGTERM_BOUND_S, f"exit took {took:.1f} s:\n{out}"
        assert "Ray dashboard: http://" in "".join(lines) + out
        # communicate() returned once every holder of the output pipe, Ray's processes too, had exited.
        # A process the kernel is still tearing down has already dropped its memory (empty cmdline)
        # but not yet its /proc entry: give that teardown a few seconds on a loaded machine.
        deadline = time.monotonic() + 10
        while (left := [p for p, started in ray_processes if _running(p, started)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"Ray processes left after exit: {[_cmdline(p) for p in left]}"
        for upload in in_flight:  # cut off by the shutdown, never answered 200
            upload.thread.join(30)
            assert upload.closed_at is not None and not upload.response.startswith(b"HTTP/1.1 200")
    finally:
        if server.poll() is None:
            server.kill()


@pytest.mark.heavy  # an `openft serve` and its Ray of its own (about 30 s): make test-heavy
def test_serve_refuses_a_worker_count_the_cluster_cannot_place():
    # The local cluster has this machine's CPUs; 64 Train workers of one CPU each never fit on it.
    data_dir = Path(tempfile.mkdtemp(prefix="oftcli-"))
    env = {**_env(), "OPENFT_TRAIN_NUM_WORKERS": "64"}
    server = subprocess.Popen(
        [*OPENFT, "serve", "--data-dir", str(data_dir), "--port", str(free_port())],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        out, err = server.communicate(timeout=180)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    assert server.returncode == 2, out + err
    assert "openft: configuration error: OPENFT_TRAIN_NUM_WORKERS: train_num_workers is 64" in err
    assert "openft API:" not in out
