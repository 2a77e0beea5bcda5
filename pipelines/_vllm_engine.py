"""The `Engine` protocol over vLLM, for GPU nodes (`settings.batch_engine == "vllm"`).

NOT EXERCISED ON THIS MACHINE: vllm is not installed here (it pins its own torch, so it runs in its
own environment: a Ray `runtime_env` or a worker image). The tests and the bench run the
transformers engine in pipelines/generate.py; this module follows vLLM's documented offline API
(`vllm.LLM(enable_lora=True, max_loras=..., max_lora_rank=...)`, `LoRARequest(name, int id,
path)`, `LLM.generate(prompts, sampling_params=[...], lora_request=[...])` with token prompts).

The same rules as the transformers engine: prompts come already rendered by the trainer's
template code, generation stops at the base's end-of-turn token (`stop_token_ids`, kept in
`token_ids`) and at `stop` strings, greedy when temperature is 0, a seed per request.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from catalog.bases import BaseModelSpec
from pipelines.generate import GenRequest, GenResult, adapter_rank, end_of_turn_ids


class VllmEngine:
    def __init__(self, llm, tokenizer, base: BaseModelSpec, lora_requests: dict):
        self.llm, self.tokenizer, self.base, self.lora_requests = llm, tokenizer, base, lora_requests
        self.eot = list(end_of_turn_ids(tokenizer, base))

    def generate(self, requests: Sequence[GenRequest], should_stop: Callable[[], bool] | None = None) -> list[GenResult]:
        # vLLM schedules a whole call itself; a stop is honoured between calls (batch_ray calls per block).
        if should_stop is not None and should_stop():
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [
            SamplingParams(max_tokens=r.params.max_tokens, temperature=r.params.temperature, top_p=r.params.top_p,
                           seed=r.params.seed, stop=list(r.params.stop) or None, stop_token_ids=self.eot,
                           skip_special_tokens=True)  # fmt: skip
            for r in requests
        ]
        loras = [self.lora_requests.get(r.adapter) if r.adapter else None for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, lora_request=loras, use_tqdm=False)
        results = []
        for r, out in zip(requests, outputs):
            choice = out.outputs[0]
            tokens = tuple(choice.token_ids)
            results.append(GenResult(r.key, tokens, choice.text, "length" if choice.finish_reason == "length" else "stop",
                                     len(r.prompt_ids), len(tokens)))  # fmt: skip
        return results


def load_vllm_engine(
    base: BaseModelSpec, *, model_source: str, cache_root: str, adapters: dict[str, dict[str, bytes]], max_batch_rows: int
) -> VllmEngine:
    from vllm import LLM
    from vllm.lora.request import LoRARequest

    from catalog.model_source import load_tokenizer, parse_model_source, resolve_base_dir

    source = parse_model_source(model_source)
    model_dir = resolve_base_dir(base, source, Path(cache_root))
    # The adapter files stay on disk for the engine's life: vLLM loads a LoRA when first used.
    root = Path(tempfile.mkdtemp(prefix="openft-vllm-adapters-"))
    lora_requests = {}
    for i, (name, files) in enumerate(sorted(adapters.items()), start=1):
        directory = root / f"a{i}"
        directory.mkdir()
        for filename, data in files.items():
            (directory / Path(filename).name).write_bytes(data)
        lora_requests[name] = LoRARequest(f"a{i}", i, str(directory))
    llm = LLM(
        model=str(model_dir), enable_lora=bool(adapters), max_loras=max(1, len(adapters)),
        max_lora_rank=_supported_rank(max([adapter_rank(f) for f in adapters.values()] or [16])),
        max_model_len=base.max_seq_length, max_num_seqs=max_batch_rows, seed=0,
    )  # fmt: skip
    return VllmEngine(llm, load_tokenizer(base, source, Path(cache_root)), base, lora_requests)


def _supported_rank(rank: int) -> int:
    # vLLM accepts a fixed set of max_lora_rank values (powers of two from 8 up, in its config check).
    value = 8
    while value < rank:
        value *= 2
    return value
