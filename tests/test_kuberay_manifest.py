"""deploy/kuberay/raycluster.yaml stays in step with the code: every OPENFT_ variable it sets is a
setting that loads, the custom resource the training settings ask for is one a worker group
declares, and the head takes no work. (Its shape was checked once against KubeRay's RayCluster
CRD schema; see docs/cluster.md.)"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from openft.settings import Settings

MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "kuberay" / "raycluster.yaml"


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_the_manifests_settings_load_and_its_resources_match_them(monkeypatch):
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    head = spec["headGroupSpec"]
    assert (head["rayStartParams"]["num-cpus"], head["rayStartParams"]["num-gpus"]) == ("0", "0")
    serve = next(c for c in _containers(head) if c.get("command", [None])[:2] == ["openft", "serve"])
    plain = {e["name"]: e["value"] for e in serve["env"] if "value" in e}
    names = {e["name"] for e in serve["env"]}
    fields = {f"OPENFT_{name.upper()}" for name in Settings.model_fields}
    assert {n for n in names if n.startswith("OPENFT_")} <= fields, sorted(names - fields - {"RAY_ADDRESS"})
    for name, value in plain.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    declared: dict[str, float] = {}
    for group in spec["workerGroupSpecs"]:
        params = group["rayStartParams"]
        if "resources" in params:  # KubeRay passes it to `ray start --resources` as one quoted JSON string
            declared.update(json.loads(json.loads(params["resources"])))
        if "num-gpus" in params:
            declared["GPU"] = float(params["num-gpus"])
    for need in (settings.train_worker_resources, settings.batch_engine_resources):
        assert need.keys() <= declared.keys(), (need, declared)


def test_the_head_runs_the_serve_proxy_with_bounded_heads():
    from entrypoints.serve_proxy import ENV, HOOK

    head = yaml.safe_load(MANIFEST.read_text())["spec"]["headGroupSpec"]
    ray_head = next(c for c in _containers(head) if c["name"] == "ray-head")
    assert {e["name"]: e.get("value") for e in ray_head["env"]}[ENV] == HOOK
