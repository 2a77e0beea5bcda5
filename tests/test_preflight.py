"""`openft serve` with a configuration that cannot work exits within seconds, non-zero, with the
cause on stderr, and starts no Ray (issue 12: each took 38-48 s and ended in Serve's generic
"Deploying application openft failed"). Then SIGTERM on a running `openft serve`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.test_cli import OPENFT, _env

# Generous: the checks answer in about a second; Ray's start alone takes longer than this here.
EXIT_BOUND_S = 20


def _serve(data_dir: Path, env: dict[str, str], *prefix: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [*prefix, *OPENFT, "serve", "--data-dir", str(data_dir), "--port", str(free_port())],
        capture_output=True, text=True, env=env, timeout=120,
    )
    return done, time.monotonic() - started


def _refused(data_dir: Path, expected: str, *prefix: str, **settings: str) -> str:
    env = {**_env(), **{k.upper() if k.startswith("aws_") else f"OPENFT_{k.upper()}": v for k, v in settings.items()}}
    done, took = _serve(data_dir, env, *prefix)
    assert done.returncode == 2, done.stdout + done.stderr
    assert took < EXIT_BOUND_S, f"took {took:.0f} s"
    assert expected in done.stderr, done.stderr
    assert "Ray" not in done.stdout + done.stderr  # refused before Ray started
    assert not (data_dir / "ray").exists() and not (data_dir / "ray_auth_token").exists()
    return done.stderr


@pytest.fixture
def data_dir():
    path = Path(tempfile.mkdtemp(prefix="oftpre-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_closed_database_port_and_one_slash_s3_url_are_both_reported(data_dir):
    err = _refused(data_dir, "OPENFT_DATABASE_URL: cannot connect to postgresql+psycopg://postgres:***@127.0.0.1:1/x",
                   database_url="postgresql+psycopg://postgres:hunter2@127.0.0.1:1/x", storage_url="s3:/bucket")
    assert "hunter2" not in err
    # `s3:/bucket` was accepted before, and the first upload then answered 500.
    assert "OPENFT_STORAGE_URL: storage URL must start with file:/// (a local directory) or s3:// (a bucket)" in err


def test_online_bases_that_would_never_answer(data_dir):
    """A base not in the catalog and one that is not servable: named, with the setting."""
    _refused(data_dir, "OPENFT_ONLINE_BASES: not a servable base of the catalog: qwen9-unknown, gpt-oss-20b",
             online_bases='["qwen2.5-0.5b-instruct", "qwen9-unknown", "gpt-oss-20b"]')


def test_objects_dir_under_a_file(data_dir):
    (data_dir / "plain-file").write_text("x")
    _refused(data_dir, "NotADirectoryError", storage_url=f"file://{data_dir}/plain-file/objects")


def test_read_only_objects_dir(data_dir):
    """A read-only mount (root ignores file modes): a tmpfs mounted read-only in a mount namespace."""
    objects = data_dir / "objects"
    objects.mkdir()
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        pytest.skip("unshare --mount is not permitted here")
    err = _refused(data_dir, "Read-only file system", "unshare", "--mount", "sh", "-c",
                   f'mount -t tmpfs -o ro tmpfs {objects} && exec "$@"', "sh")
    assert f"OPENFT_STORAGE_URL: cannot write to file://{objects}" in err


def test_refused_s3_credentials(data_dir, seaweed):
    err = _refused(data_dir, "SignatureDoesNotMatch", storage_url="s3://openft-preflight/x",
                   s3_endpoint_url=seaweed.endpoint_url, aws_secret_access_key="not-the-key")
    assert "not-the-key" not in err


def test_a_cluster_of_several_nodes_refuses_state_on_the_heads_disk(data_dir):
    """The rule `openft serve` applies once Ray is up (entrypoints/preflight.py `check_cluster`);
    the cluster suite (tests/cluster) reaches it on a real three-node cluster."""
    from entrypoints.preflight import shared_disk_problems
    from openft.settings import Settings

    laptop = Settings(data_dir=data_dir)
    assert shared_disk_problems(laptop, 1) == []  # one node: the embedded defaults are right
    problems = shared_disk_problems(laptop, 3)
    assert [p.split(":", 1)[0] for p in problems] == ["OPENFT_DATABASE_URL", "OPENFT_STORAGE_URL"]
    assert all("3 nodes" in p for p in problems)
    shared = Settings(data_dir=data_dir, database_url="postgresql+psycopg://u@db/openft",
                      storage_url=f"file://{data_dir / 'nfs'}")  # an explicit directory: the operator's shared mount
    assert shared_disk_problems(shared, 3) == []
    assert shared_disk_problems(Settings(data_dir=data_dir, storage_url="s3://b/p"), 3) == [problems[0]]
