"""`openft demo` as a new user runs it (`make demo`): a real local Ray, the real SDK, real training.
Its output says only what the demo did: no third-party noise, a base column with what the base
answered, a progress bar that starts at the job's real total, and nothing left behind in the
temporary directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import SESSION_DIR, free_port
from tests.utils.service import ray_env

pytestmark = pytest.mark.e2e

NOISE = ("gemm_4bit_forward", "Connecting to existing Serve app", "graceful_shutdown", "PYTHON worker processes",
         "Loading weights", "FutureWarning", "Started a local Ray instance", "(raylet)")  # fmt: skip
ROW = re.compile(r"^(?P<ticket>.{58}) (?P<label>\S+)\s+(?P<base>\S.{0,15}?)\s+(?P<tuned>\S+)$")


def test_the_demo_cleans_up_and_prints_only_what_it_did():
    tmp_path = SESSION_DIR / "demo"  # short: Ray's unix sockets live under TMPDIR (107 bytes at most)
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir(parents=True)
    env = {**ray_env(), "TMPDIR": str(own_tmp)}
    env.pop("RAY_AUTH_TOKEN_PATH", None)  # the demo prepares its own token under its data dir, as on a laptop
    env.pop("RAY_AUTH_MODE", None)
    done = subprocess.run([sys.executable, "-m", "entrypoints.cli", "demo", "--port", str(free_port())], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    out = done.stdout + done.stderr
    (tmp_path / "demo.log").write_text(out)
    assert done.returncode == 0, out[-3000:]

    for noise in NOISE:
        assert noise not in out, f"{noise!r} in the demo's output"

    # The bar is made at the first metrics event, with the job's total of steps: never 0/1 first.
    totals = {int(t) for t in re.findall(r"training:.*?\| *\d+/(\d+) ", out)}
    assert len(totals) == 1 and totals.pop() > 1, totals
    steps = [int(s) for s in re.findall(r"training:.*?\| *(\d+)/\d+ ", out)]
    assert steps == sorted(steps) and steps[-1] > steps[0]

    table = out.split("held-out ticket", 1)[1].split("accuracy on", 1)[0].strip().splitlines()[1:]
    rows = [ROW.match(line) for line in table]
    assert rows and all(rows), table[:3]
    assert all(row["base"].strip() for row in rows)  # the untrained base answers newlines: shown escaped
    tuned_right = sum(row["tuned"] == row["label"] for row in rows)
    assert f"fine-tuned {tuned_right}/{len(rows)}" in out

    assert "removed when the demo ends" in out
    assert [p.name for p in own_tmp.iterdir() if p.name.startswith("openft-adapter-")] == []
