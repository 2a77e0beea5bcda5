"""Benchmark of the merge: our per-shard streaming Ray merge vs peft's merge_and_unload + save_pretrained.

Generates a Qwen2-shaped base of realistic width (hidden 2048, intermediate 8192, 10 layers,
32k vocabulary, untied lm_head: about 1.5 GB of random bf16 in 4 shards) and a rank-16 LoRA on all
seven linear modules of every layer, then merges it both ways, each side in its own subprocess:
  ours  `run_merge` on a local Ray with 2 CPUs (ray.init and warm-up of the two workers untimed,
        as in a running service), reading and writing a file:// store, digests and read-back included;
  peft  `from_pretrained` (bf16) + `PeftModel.from_pretrained` + `merge_and_unload` +
        `save_pretrained` with the same shard size; imports untimed.
The sides run alternately, `--rounds` times each (peft, ours, peft, ours, ...), and the medians
are compared: on this VM a fresh page of memory or page cache costs ~1 s/GB when the balloon has
returned it to the host, so one run of either side can be 2x off its median.

The last run's two exports are compared tensor by tensor (`tensors_differing_from_peft`: 0 means
every bit equal).

Peak memory is the largest sum of RSS over the side's whole process tree, sampled every 20 ms
while the timed part runs, and the tree's RSS just before. `memory_ratio` compares what the merge
itself takes: each side's peak above its idle tree (Ray's daemons and two warm workers for ours,
which a running service holds whether or not it merges; the imported libraries for peft).
`memory_ratio_whole_tree` compares the peaks with the idle trees included.
The last line printed is one JSON object.

    python bench/merge.py [--layers 10] [--rounds 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE_ID = "qwen2.5-7b-instruct"  # any untied catalog base: only its id, repo and revision are used
HIDDEN, INTER, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 2048, 8192, 32000, 16, 4, 128
SHARD_BYTES = 400_000_000
R, ALPHA = 16, 32
MODULES = {
    "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "mlp.gate_proj": (INTER, HIDDEN),
    "mlp.up_proj": (INTER, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTER),
}


class TreeSampler:
    """Peak of the summed RSS of this process and all its descendants."""

    def __init__(self, period_s: float = 0.02):
        import psutil

        self._me, self._period, self.peak, self._stop = psutil.Process(), period_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        import psutil

        total = 0
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass  # a process that ended between listing and reading holds no memory
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self._period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def generate(work: Path, layers: int) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    from catalog.bases import get_base
    from catalog.model_source import REVISION_MARKER
    from merge.plan import pinned_path

    base = get_base(BASE_ID)
    mirror = work / "mirror" / base.hf_repo
    mirror.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    pool = (torch.randn(80_000_000, generator=gen) * 0.02).to(torch.bfloat16)

    def rand(*shape):
        n = 1
        for d in shape:
            n *= d
        off = int(torch.randint(0, pool.numel() - n, (1,), generator=gen))
        return pool[off : off + n].view(*shape)

    tensors = [("model.embed_tokens.weight", rand(VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", torch.ones(HIDDEN, dtype=torch.bfloat16))]
        for m, shape in MODULES.items():
            tensors.append((p + m + ".weight", rand(*shape)))
            if m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                tensors.append((p + m + ".bias", rand(shape[0])))
        tensors += [(p + "post_attention_layernorm.weight", torch.ones(HIDDEN, dtype=torch.bfloat16))]
    tensors += [("model.norm.weight", torch.ones(HIDDEN, dtype=torch.bfloat16)), ("lm_head.weight", rand(VOCAB, HIDDEN))]
    shards, current, size = [], {}, 0
    for name, t in tensors:
        if current and size + t.numel() * 2 > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name], size = t, size + t.numel() * 2
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.clone() for k, v in shard.items()}, mirror / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
        total += sum(v.numel() * 2 for v in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (mirror / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    Qwen2Config(
        hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=layers, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"],
    ).to_json_file(mirror / "config.json")  # fmt: skip
    (mirror / REVISION_MARKER).write_text(base.revision)
    files = {p.name: _sha256(p) for p in mirror.iterdir() if p.name != REVISION_MARKER}
    pinned = pinned_path(base, work / "cache")
    pinned.parent.mkdir(parents=True)
    pinned.write_text(json.dumps({"base": base.id, "revision": base.revision, "files": files}))

    adapter, targets = work / "adapter", sorted({m.split(".")[-1] for m in MODULES})
    adapter.mkdir()
    factors = {}
    for i in range(layers):
        for m, (out_dim, in_dim) in MODULES.items():
            p = f"base_model.model.model.layers.{i}.{m}"
            factors[p + ".lora_A.weight"] = torch.randn(R, in_dim, generator=gen) * 0.01
            factors[p + ".lora_B.weight"] = torch.randn(out_dim, R, generator=gen) * 0.01
    save_file(factors, adapter / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base.hf_repo,
              "revision": base.revision, "r": R, "lora_alpha": ALPHA, "target_modules": targets, "bias": "none",
              "lora_dropout": 0.0, "fan_in_fan_out": False, "use_dora": False, "use_rslora": False}  # fmt: skip
    (adapter / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return {"weights_bytes": total, "shards": len(shards), "base_dir": str(mirror)}


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def side_ours(work: Path) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from merge.run import MergeRequest, run_merge
    from storage.objects import open_object_store

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="oft-bench-"))

    @ray.remote(num_cpus=1)
    def warm():
        import merge.shard  # noqa: F401  (torch and the task's module, as in a running service)

        time.sleep(0.5)
        return os.getpid()

    ray.get([warm.remote() for _ in range(2)])
    store = open_object_store((work / "objects").as_uri())
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        store.put_bytes(f"adapters/a1/{name}", (work / "adapter" / name).read_bytes())
    req = MergeRequest(BASE_ID, f"dir:{work / 'mirror'}", str(work / "cache"), store.spec(), "adapters/a1", "exports/m1")
    sampler = TreeSampler()
    idle = sampler.now()
    with sampler:
        t0 = time.perf_counter()
        result = run_merge(req)
        wall = time.perf_counter() - t0
    ray.shutdown()
    return {"wall_s": wall, "peak_tree_rss": sampler.peak, "idle_tree_rss": idle, "files": len(result.files)}


def side_peft(work: Path) -> dict:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = next((work / "mirror").glob("*/*"))
    sampler = TreeSampler()
    idle = sampler.now()
    with sampler:
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
        merged = PeftModel.from_pretrained(model, work / "adapter").merge_and_unload()
        merged.save_pretrained(work / "peft-out", max_shard_size=SHARD_BYTES)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "peak_tree_rss": sampler.peak, "idle_tree_rss": idle}


def run_side(side: str, work: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--side", side, "--work", str(work)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _differing_tensors(ours: Path, peft: Path) -> int:
    """How many tensors of the two exports differ in any bit (or exist in only one)."""
    from safetensors import safe_open

    def tensors(directory: Path) -> dict:
        out = {}
        for shard in sorted(directory.glob("model*.safetensors")):
            with safe_open(shard, "pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
        return out

    a, b = tensors(ours), tensors(peft)
    return len(a.keys() ^ b.keys()) + sum(1 for k in a.keys() & b.keys() if not a[k].equal(b[k]))


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the runs (the wall time and the memory figures independently)."""
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "peak_tree_rss", "idle_tree_rss")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", choices=("ours", "peft"))
    ap.add_argument("--work")
    ap.add_argument("--keep", help="generate into this directory and keep it")
    args = ap.parse_args()
    if args.side:
        fn = side_ours if args.side == "ours" else side_peft
        print(json.dumps(fn(Path(args.work))))
        return
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="merge-bench-"))
    try:
        t0 = time.perf_counter()
        info = generate(work, args.layers)
        print(f"generated {info['weights_bytes'] / 1e9:.2f} GB in {info['shards']} shards in {time.perf_counter() - t0:.1f}s")
        runs: dict[str, list[dict]] = {"peft": [], "ours": []}
        for _ in range(args.rounds):
            for side in ("peft", "ours"):
                # Each side starts with no dirty pages to flush: otherwise the side that fsyncs (ours)
                # would also wait on the writeback of what the previous run left in the page cache.
                shutil.rmtree(work / "peft-out" if side == "peft" else work / "objects" / "exports", ignore_errors=True)
                os.sync()
                runs[side].append(run_side(side, work))
        peft, ours = (_median(runs[side]) for side in ("peft", "ours"))
        differing = _differing_tensors(work / "objects" / "exports" / "m1", work / "peft-out")
        gb = info["weights_gb"] = info["weights_bytes"] / 1e9
        figures = {
            "weights_gb": round(gb, 3),
            "shards": info["shards"],
            "rounds": args.rounds,
            "ours_wall_s": round(ours["wall_s"], 2),
            "peft_wall_s": round(peft["wall_s"], 2),
            "ours_wall_s_runs": [round(r["wall_s"], 2) for r in runs["ours"]],
            "peft_wall_s_runs": [round(r["wall_s"], 2) for r in runs["peft"]],
            "ours_gb_per_s": round(gb / ours["wall_s"], 3),
            "peft_gb_per_s": round(gb / peft["wall_s"], 3),
            "ours_peak_rss_mb": round(ours["peak_tree_rss"] / 2**20),
            "ours_idle_rss_mb": round(ours["idle_tree_rss"] / 2**20),
            "peft_peak_rss_mb": round(peft["peak_tree_rss"] / 2**20),
            "peft_idle_rss_mb": round(peft["idle_tree_rss"] / 2**20),
            "speed_ratio": round(peft["wall_s"] / ours["wall_s"], 2),
            "memory_ratio": round(
                (ours["peak_tree_rss"] - ours["idle_tree_rss"]) / (peft["peak_tree_rss"] - peft["idle_tree_rss"]), 3
            ),
            "memory_ratio_whole_tree": round(ours["peak_tree_rss"] / peft["peak_tree_rss"], 3),
            "tensors_differing_from_peft": differing,
        }
        print(json.dumps(figures))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
