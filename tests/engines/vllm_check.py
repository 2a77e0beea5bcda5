"""Runs OUR vLLM engine (pipelines/_vllm_engine.py) with a real vLLM, in its own venv.

    .venv-vllm/bin/python tests/engines/vllm_check.py SPEC.json OUT.json

Not a test module: tests/pipelines/test_vllm_engine.py (main venv) writes SPEC, runs this in a
subprocess and compares OUT with the transformers engine. SPEC holds the base id, the cache root
holding its stand-in (built by the main venv first, so both engines read the same files), the
adapters as directories of peft files, and the requests with their prompt ids already rendered.
OUT holds one result per request plus the timings. Only vLLM and our light modules are imported:
the training stack (peft, ray) is not installed in .venv-vllm.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(spec_path: str, out_path: str) -> None:
    sys.path.insert(0, str(ROOT))
    import vllm

    from catalog.bases import get_base
    from pipelines._vllm_engine import load_vllm_engine
    from graders.model_graders import ChoiceAnswer, NumberAnswer
    from pipelines.generate import GenRequest, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    base = get_base(spec["base"])
    adapters = {
        name: {f.name: f.read_bytes() for f in Path(directory).iterdir() if f.is_file()}
        for name, directory in spec["adapters"].items()
    }
    started = time.monotonic()
    engine = load_vllm_engine(base, model_source="standin", cache_root=spec["cache_root"], adapters=adapters,
                              max_batch_rows=spec["max_batch_rows"])  # fmt: skip
    load_s = time.monotonic() - started
    def answer(form: dict | None):
        if form is None:
            return None
        return NumberAnswer(*form["range"]) if "range" in form else ChoiceAnswer(tuple(form["options"]))

    requests = [
        GenRequest(r["key"], r["adapter"], tuple(r["prompt_ids"]),
                   SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, stop=tuple(r["stop"]),
                                  answer=answer(r.get("answer"))))  # fmt: skip
        for r in spec["requests"]
    ]
    runs = []
    for _ in range(spec.get("repeats", 1)):  # a repeat shows vLLM's greedy is deterministic too
        started = time.monotonic()
        results = engine.generate(requests)
        runs.append({"generate_s": time.monotonic() - started,
                     "results": [{"key": r.key, "token_ids": list(r.token_ids), "text": r.text,
                                  "finish_reason": r.finish_reason, "completion_tokens": r.completion_tokens}
                                 for r in results]})  # fmt: skip
    out = {"vllm_version": vllm.__version__, "load_s": load_s, "runs": runs}
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":  # vLLM spawns its engine core: the engine is built under this guard
    main(*sys.argv[1:3])
