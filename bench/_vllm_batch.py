"""The GPU check's vLLM part of the batch stage (bench/_gpu_serve.py), run in vLLM's own venv.

    VLLM_PYTHON bench/_vllm_batch.py SPEC.json OUT.json

Like tests/engines/vllm_check.py, it runs OUR vLLM engine (pipelines/_vllm_engine.py) and imports
only vLLM and our light modules. SPEC names the base, its model source (the check's generated
7B-shaped base), the adapters as directories of peft files and the requests (prompt ids already
rendered). It times all rows in one call (4 adapters together) against one call per adapter, on
one engine (loading excluded), and writes the figures and each row's tokens to OUT.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(spec_path: str, out_path: str) -> None:
    sys.path.insert(0, str(ROOT))
    import vllm

    from catalog.bases import get_base
    from pipelines._vllm_engine import load_vllm_engine
    from pipelines.generate import GenRequest, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    adapters = {name: {f.name: f.read_bytes() for f in Path(d).iterdir() if f.is_file()} for name, d in spec["adapters"].items()}
    started = time.monotonic()
    engine = load_vllm_engine(get_base(spec["base"]), model_source=spec["model_source"], cache_root=spec["cache_root"],
                              adapters=adapters, max_batch_rows=spec["max_batch_rows"])  # fmt: skip
    load_s = time.monotonic() - started
    requests = [GenRequest(r["key"], r["adapter"], tuple(r["prompt_ids"]), SamplingParams(r["max_tokens"], temperature=0.0))
                for r in spec["requests"]]  # fmt: skip
    engine.generate(requests[:2])  # warm-up
    started = time.monotonic()
    multi = engine.generate(requests)
    multi_s = time.monotonic() - started
    started = time.monotonic()
    per_adapter = [r for name in sorted(adapters) for r in engine.generate([q for q in requests if q.adapter == name])]
    per_adapter_s = time.monotonic() - started
    tokens = sum(r.completion_tokens for r in multi)
    out = {
        "vllm_version": vllm.__version__, "load_s": round(load_s, 2), "generated_tokens": tokens,
        "multi_tok_s": round(tokens / multi_s, 1),
        "per_adapter_tok_s": round(sum(r.completion_tokens for r in per_adapter) / per_adapter_s, 1),
        "tokens": {str(r.key): list(r.token_ids) for r in multi},
    }
    out["multi_vs_per_adapter"] = round(out["multi_tok_s"] / out["per_adapter_tok_s"], 3)
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM spawns its engine core: the engine is built under this guard
    main(*sys.argv[1:3])
