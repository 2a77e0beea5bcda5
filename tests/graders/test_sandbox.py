"""The python sandbox against escapes, with small limits: each is contained and graded 0 with a
reason naming what stopped it. (The same through the API, and the service working after: tests/
serve_app/test_graders_api.py.)"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from graders import grade, sample_namespace, validate
from graders.grade import Runtime
from graders.sandbox import SandboxLimits, available, run_python

pytestmark = pytest.mark.skipif(not available(), reason="bubblewrap is not installed (apt-get install bubblewrap)")
LIMITS = SandboxLimits(wall_seconds=4, cpu_seconds=1, memory_bytes=384 * 2**20, disk_bytes=2**20, max_processes=16)
SECRET_DIR = "/tmp"  # replaced per test by tmp_path


def _run(source: str, item=None):
    return run_python(source, sample_namespace("answer"), item or {}, LIMITS)


def test_a_grade_returns_its_score_and_reads_sample_and_item():
    result = _run("def grade(sample, item):\n    return len(sample['output_text']) / item['n']\n", {"n": 12})
    assert result.score == pytest.approx(0.5) and result.limit is None


@pytest.mark.parametrize(("body", "limit", "named"), [
    ("while True:\n        pass", "cpu_time", "CPU-time limit"),
    ("import time\n    time.sleep(60)", "wall_time", "wall-time limit"),
    ("x = bytearray(4 * 1024 ** 3)", "memory", "memory limit"),
    ("open('/tmp/big', 'wb').write(b'x' * 4 * 1024 ** 2)", "disk", "disk limit"),
    ("import os\n    while True:\n        os.fork()", "processes", "process limit"),
])
def test_a_broken_limit_is_named(body, limit, named):
    # The wall limit stays far above the CPU limit except where the wall is the point: on a loaded
    # machine a CPU-second can take many seconds of wall time.
    limits = LIMITS if limit == "wall_time" else replace(LIMITS, wall_seconds=60)
    result = run_python(f"def grade(sample, item):\n    {body}\n    return 1.0\n", sample_namespace("answer"), {}, limits)
    assert (result.score, result.limit) == (None, limit)
    assert named in result.reason


def test_no_network(tmp_path):
    # 127.0.0.1 in its own network namespace: the host's PostgreSQL port answers nothing there.
    result = _run("import socket\ndef grade(sample, item):\n"
                  "    socket.create_connection(('127.0.0.1', 5432), timeout=2)\n    return 1.0\n")
    assert result.score is None and result.error == "exception"
    assert "ConnectionRefusedError" in result.details or "OSError" in result.details


def test_no_service_files_no_environment_and_a_read_only_root(tmp_path):
    secret = tmp_path / "openft.db"
    secret.write_text("secret")
    os.environ["OPENFT_SANDBOX_PROBE"] = "secret"
    try:
        for body in (f"return len(open({str(secret)!r}).read())", "import os\n    return len(os.environ['OPENFT_SANDBOX_PROBE'])",
                     "open('/usr/lib/x', 'w')", "open('/x', 'w')", f"open({str(tmp_path / 'out')!r}, 'w')"):
            result = _run(f"def grade(sample, item):\n    {body}\n    return 1.0\n")
            assert result.score is None and result.error == "exception", body
        leaked = _run("import os\ndef grade(sample, item):\n"
                      "    return float(any('OPENFT' in k for k in os.environ)) + len(os.environ) / 100\n")
        assert leaked.score is not None and leaked.score < 1  # PATH, HOME, LANG only
    finally:
        del os.environ["OPENFT_SANDBOX_PROBE"]
    assert not (tmp_path / "out").exists()


def test_scratch_is_writable_within_its_size():
    result = _run("def grade(sample, item):\n    open('/tmp/s', 'w').write('abc')\n    return len(open('/tmp/s').read())\n")
    assert result.score == 3.0


def test_through_grade_a_failure_is_zero_with_its_reason():
    grader = validate({"type": "python", "name": "p", "source": "def grade(s, i):\n    raise KeyError('k')\n"})
    result = grade(grader, sample_namespace("x"), {}, Runtime(sandbox=LIMITS))
    assert (result.score, result.passed) == (0.0, False)
    assert "KeyError" in result.reason and result.details["errors"] == {"python_grader_runtime_error": True}


def test_an_interpreter_under_tmp_or_reached_through_a_symlink_still_runs(tmp_path):
    """Two checkouts' layouts that once gave every grade `no_result`: a venv under /tmp (hidden by the
    sandbox's own scratch tmpfs, mounted over /tmp) and a .venv that is a symlink to another
    checkout's (only its real path is mounted, so the interpreter must be named by that path)."""
    import subprocess
    import sys
    from pathlib import Path

    from graders.sandbox import PythonRuntime

    assert str(tmp_path).startswith("/tmp/")
    venv = tmp_path / "under-tmp"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    runtime = PythonRuntime(executable=str(venv / "bin" / "python"),
                            mounts=(str(venv), os.path.realpath(sys.base_prefix)))
    assert run_python("def grade(sample, item):\n    return 0.25\n", sample_namespace("a"), {}, LIMITS, runtime).score == 0.25

    link = tmp_path / "linked-venv"
    link.symlink_to(Path(sys.prefix).resolve())
    code = ("from graders import sample_namespace\nfrom graders.sandbox import run_python\n"
            "print(run_python('def grade(sample, item):\\n    return 0.5\\n', sample_namespace('a'), {}).score)")
    out = subprocess.run([str(link / "bin" / "python"), "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "0.5", out.stderr[-2000:]
