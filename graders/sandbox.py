"""The python grader's sandbox: the user's `grade(sample, item)` in a process of its own, per run,
inside Debian's bubblewrap (`bwrap`), with util-linux's `setpriv` and `prlimit` for the rest.

Why bubblewrap: it is the kernel's own namespaces, driven by a small, maintained, widely audited
tool (Flatpak's); a hand-written unshare/mount/pivot_root sequence would be the same calls with
none of that review. What each part contains:

- network: a network namespace of its own (`--unshare-net`): only its own loopback, so neither the
  service, the database, the object store nor anything outside answers;
- files: a new root of bind mounts, read-only (`--remount-ro /`): /usr (the system's libraries),
  the Python runtime and its site-packages (so numpy, rapidfuzz, ... import as in OpenAI's image),
  a fresh /proc and /dev, and one writable tmpfs, /tmp, of `disk_bytes`, the scratch dir and
  home. The data dir, the service's source tree, its settings, the database and object store are
  never mounted; the environment is cleared (`--clearenv`: PATH, HOME and LANG only);
- processes: its own pid namespace (everything in it dies with its first process), ipc, uts and
  cgroup namespaces; the code runs as an unprivileged uid drawn per run (`setpriv`, every
  capability dropped, no_new_privs), so RLIMIT_NPROC counts only that run's processes;
- limits (`prlimit`, inherited by every process of the run): RLIMIT_CPU `cpu_seconds` (SIGXCPU,
  then SIGKILL a second later), RLIMIT_AS `memory_bytes` (an allocation past it is MemoryError),
  RLIMIT_FSIZE and the tmpfs size `disk_bytes`, RLIMIT_NPROC `max_processes` (a fork bomb gets
  EAGAIN); the wall clock `wall_seconds` is the caller's: the whole process group is killed.
  OpenAI's limits are the defaults: 2 minutes, 2 GB of memory, 1 GB of disk.

A run that breaks a limit, raises, returns a non-number or prints nothing is a `SandboxResult`
with `limit` or `error` saying which, never an exception of ours. The input (source, sample,
item) reaches the sandbox as a read-only file copied from a descriptor (`--ro-bind-data`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTPUT_BYTES = 64 * 1024  # of the runner's report; anything the user's code writes past it is read and dropped
LIMIT_NAMES = {
    "wall_time": "wall-time limit", "cpu_time": "CPU-time limit", "memory": "memory limit",
    "disk": "disk limit", "processes": "process limit",
}


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 120.0
    cpu_seconds: int = 120
    memory_bytes: int = 2 * 1024**3
    disk_bytes: int = 1024**3
    max_processes: int = 64
    uid_base: int = 200_000  # runs draw an unused-by-accounts uid from [uid_base, uid_base + uid_span)
    uid_span: int = 100_000

    @classmethod
    def of(cls, settings) -> "SandboxLimits":
        """The limits the service's settings (`grader_python_*`) give; graders/ reads no settings itself."""
        return cls(wall_seconds=settings.grader_python_wall_seconds, cpu_seconds=settings.grader_python_cpu_seconds,
                   memory_bytes=settings.grader_python_memory_bytes, disk_bytes=settings.grader_python_disk_bytes,
                   max_processes=settings.grader_python_max_processes)


@dataclass(frozen=True)
class PythonRuntime:
    """The interpreter the sandbox runs and the directories it needs mounted (defaults: this one)."""

    executable: str = field(default_factory=lambda: _inside(sys.executable))
    mounts: tuple[str, ...] = field(default_factory=lambda: tuple(sorted({
        os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})))


def _inside(executable: str) -> str:
    """The interpreter's path under the mounted (resolved) prefix: a venv reached through a symlink
    (a checkout whose .venv links to another) is mounted at its real path only, and resolving the
    interpreter itself would leave the venv (its pyvenv.cfg is found beside the path it runs as)."""
    prefix = sys.prefix
    if os.path.commonpath([os.path.abspath(executable), prefix]) != prefix:
        return executable
    return os.path.join(os.path.realpath(prefix), os.path.relpath(executable, prefix))


@dataclass(frozen=True)
class SandboxResult:
    score: float | None
    limit: str | None = None  # a key of LIMIT_NAMES: which limit the run broke
    error: str | None = None  # exception | not_a_number | no_result | sandbox_unavailable
    details: str | None = None  # the exception's class and message (the caller's own code), at most 500 chars
    seconds: float = 0.0

    @property
    def reason(self) -> str | None:
        if self.limit is not None:
            return f"The python grader was stopped at the sandbox's {LIMIT_NAMES[self.limit]}."
        if self.error == "exception":
            return f"The python grader raised {self.details}."
        if self.error == "not_a_number":
            return "The python grader's grade() returned something that is not a finite number."
        if self.error == "sandbox_unavailable":
            return "Python graders need bubblewrap (bwrap), setpriv and prlimit on this node; install them."
        if self.error == "no_result":
            return "The python grader's process ended without a result."
        return None


# Runs inside the sandbox as `python -I -c RUNNER`. Only its first process reports; a child it
# forked (a fork bomb's) exits quietly.
RUNNER = r"""
import errno, json, math, os, signal
_pid = os.getpid()
_out = os.dup(1)
_null = os.open("/dev/null", os.O_WRONLY)
os.dup2(_null, 1); os.dup2(_null, 2)
def _report(result):
    if os.getpid() == _pid:
        os.write(_out, json.dumps(result).encode())
    os._exit(0)
signal.signal(signal.SIGXCPU, lambda *_: _report({"limit": "cpu_time"}))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
try:
    with open("/grader/input.json") as f:
        _data = json.load(f)
    _scope = {"__name__": "grader"}
    exec(compile(_data["source"], "grader.py", "exec"), _scope)
    _value = _scope["grade"](_data["sample"], _data["item"])
    if isinstance(_value, bool) or not isinstance(_value, (int, float)) or not math.isfinite(_value):
        _report({"error": "not_a_number"})
    _report({"score": float(_value)})
except MemoryError:
    _report({"limit": "memory"})
except OSError as e:
    if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        _report({"limit": "disk"})
    if e.errno == errno.EAGAIN:
        _report({"limit": "processes"})
    _report({"error": "exception", "details": (type(e).__name__ + ": " + str(e))[:500]})
except BaseException as e:
    _report({"error": "exception", "details": (type(e).__name__ + ": " + str(e))[:500]})
"""


def available() -> bool:
    return all(shutil.which(tool) for tool in ("bwrap", "setpriv", "prlimit"))


def _parents(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def command(limits: SandboxLimits, runtime: PythonRuntime, input_fd: int, uid: int) -> list[str]:
    root = os.geteuid() == 0
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session",
           "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
           "--symlink", "usr/bin", "/bin",
           "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.disk_bytes), "--tmpfs", "/tmp"]
    # The interpreter's mounts come after the scratch tmpfs: a venv under /tmp (a checkout there)
    # would otherwise be hidden by it.
    made = {"/usr", "/tmp"}
    for mount in runtime.mounts:
        # bwrap makes missing parents with the source's modes (/root is 0700): 0755 ones instead.
        for parent in _parents(mount):
            if parent not in made and not parent.startswith("/usr/"):
                made.add(parent)
                cmd += ["--perms", "0755", "--dir", parent]
        if not mount.startswith("/usr/"):
            cmd += ["--ro-bind", mount, mount]
    cmd += ["--perms", "0755", "--dir", "/grader", "--perms", "0444", "--ro-bind-data", str(input_fd), "/grader/input.json",
            "--remount-ro", "/", "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    if root:
        # Root sets the mounts up, then the run drops to its own uid with no capabilities left.
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "setpriv", f"--reuid={uid}", f"--regid={uid}",
                "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
    cmd += ["prlimit", f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}", f"--as={limits.memory_bytes}",
            f"--fsize={limits.disk_bytes}", f"--nproc={limits.max_processes}", "--core=0", "--",
            runtime.executable, "-I", "-c", RUNNER]
    return cmd


def run_python(source: str, sample: Any, item: Any, limits: SandboxLimits | None = None,
               runtime: PythonRuntime | None = None) -> SandboxResult:
    """One grade in a fresh sandbox. Never raises for what the user's code does."""
    limits, runtime = limits or SandboxLimits(), runtime or PythonRuntime()
    if not available():
        return SandboxResult(None, error="sandbox_unavailable")
    started = time.monotonic()
    payload = json.dumps({"source": source, "sample": sample, "item": item}).encode()
    with tempfile.TemporaryFile() as data:
        data.write(payload)
        data.seek(0)
        uid = limits.uid_base + secrets.randbelow(limits.uid_span)
        proc = subprocess.Popen(command(limits, runtime, data.fileno(), uid), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(data.fileno(),),
                                start_new_session=True)
        output = bytearray()
        reader = threading.Thread(target=_read_bounded, args=(proc.stdout, output), daemon=True)
        reader.start()
        status: list = []
        waiter = threading.Thread(target=lambda: status.append(os.wait4(proc.pid, 0)), daemon=True)
        waiter.start()
        waiter.join(limits.wall_seconds)
        timed_out = waiter.is_alive()
        if timed_out:
            # The group is bwrap and its pid-1 reaper; the sandbox's pid namespace dies with them.
            os.killpg(proc.pid, signal.SIGKILL)
            waiter.join()
        reader.join(5)
        proc.returncode = os.waitstatus_to_exitcode(status[0][1])  # reaped here, not by Popen
        proc.stdout.close()
    seconds = time.monotonic() - started
    if timed_out:
        return SandboxResult(None, limit="wall_time", seconds=seconds)
    try:
        report = json.loads(bytes(output))
    except ValueError:
        report = {}
    if "score" in report and isinstance(report["score"], float):
        return SandboxResult(report["score"], seconds=seconds)
    if report.get("limit") in LIMIT_NAMES:
        return SandboxResult(None, limit=report["limit"], seconds=seconds)
    if report.get("error") in ("exception", "not_a_number"):
        details = report.get("details")
        return SandboxResult(None, error=report["error"], details=details[:500] if isinstance(details, str) else None,
                             seconds=seconds)
    # No report: killed by a signal (SIGXCPU's handler could not run inside a C call; the hard limit's SIGKILL).
    usage = status[0][2]
    if proc.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and \
            usage.ru_utime + usage.ru_stime >= limits.cpu_seconds * 0.9:
        return SandboxResult(None, limit="cpu_time", seconds=seconds)
    return SandboxResult(None, error="no_result", seconds=seconds)


def _read_bounded(stream, into: bytearray) -> None:
    while True:
        chunk = stream.read1(65536)
        if not chunk:
            return
        if len(into) < OUTPUT_BYTES:
            into += chunk[: OUTPUT_BYTES - len(into)]
