"""A merge whose driver's base directory does not exist where its shard tasks run, as on a cluster
whose nodes have disks of their own: the driver runs in a mount namespace with a private tmpfs over
its model cache, so the stand-in it resolves is invisible to the Ray workers (outside that
namespace). The shard tasks must resolve the base in their own cache, and the export must be the
one a driver sharing its cache with the workers writes."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from catalog.standins import MANIFEST, standin_dir
from merge.run import run_merge
from tests.merge.builders import store_request

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import pickle, sys
import ray
from merge.run import run_merge
req_path, address, out_path = sys.argv[1:]
ray.init(address=address, log_to_driver=False)
result = run_merge(pickle.loads(open(req_path, "rb").read()))
open(out_path, "wb").write(pickle.dumps(result))
"""


def _private_mounts_allowed() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "--mount", "true"]).returncode == 0


@pytest.mark.heavy  # a 7B-shaped stand-in merged by shard tasks on nodes of their own (about 25 s): make test-heavy
def test_shard_tasks_resolve_the_base_in_their_own_nodes_cache(tmp_path, qwen7b, qwen7b_adapter, model_cache, ray_cluster):
    if not _private_mounts_allowed():
        pytest.skip("unshare --mount is not permitted here")
    base, _ = qwen7b
    driver_cache = tmp_path / "cache"  # the driver's: a tmpfs in its namespace, empty to the workers
    driver_cache.mkdir()
    req = store_request(tmp_path / "own", base, qwen7b_adapter, model_source="standin", cache_root=driver_cache)
    (tmp_path / "req.pkl").write_bytes(pickle.dumps(req))
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(driver_cache),
         sys.executable, "-c", DRIVER, str(tmp_path / "req.pkl"), address, str(tmp_path / "out.pkl")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    on_own_nodes = pickle.loads((tmp_path / "out.pkl").read_bytes())

    # The workers generated the stand-in themselves: the driver's copy never left its tmpfs.
    assert [p.parent.name for p in (driver_cache / "standins").glob(f"*/{MANIFEST}")] == [standin_dir(base, model_cache).name]
    shared = run_merge(store_request(tmp_path / "shared", base, qwen7b_adapter, model_source="standin", cache_root=model_cache))
    assert [(f["path"], f["sha256"]) for f in on_own_nodes.files] == [(f["path"], f["sha256"]) for f in shared.files]
    assert on_own_nodes.manifest == shared.manifest
