"""Batch generation: prompt rendering and a multi-LoRA engine over one base. Pure, no Ray.

`pipelines/batch_ray.py` holds one engine per Ray actor; the serving-parity check
(train/parity.py) uses the same engine. An `Engine` (pipelines/engine.py, the contract both
engines implement) takes `GenRequest`s (prompt ids, the adapter by name, sampling params) and
returns one `GenResult` per request, in request order; `load_engine` picks the transformers
engine here or the vLLM one (pipelines/_vllm_engine.py).

The transformers engine (`TransformersEngine`) is our own decode loop, not `model.generate`:
- the base is loaded once and every adapter of the batch is loaded onto it by name (peft
  `load_adapter`); a decode step runs rows of different adapters together through peft's
  mixed-adapter forward (`adapter_names=[...]`, one name per row, "__base__" for the base alone);
- rows are queued sorted by (adapter, prompt length) so a step mixes few adapters and similar
  lengths; up to `max_batch_rows` rows decode together on one KV cache (`DynamicCache`);
- a row that finishes leaves the batch at once and a queued row takes its place: the newcomer is
  prefilled alone (no padding, so its prompt pass is the one plain `generate` does) and its cache
  is spliced into the running one, left-padded with masked zeros. Leading columns that no row
  needs any more are dropped. Caches with sliding-window or linear-attention layers (gpt-oss,
  qwen3.5: both not servable) are not spliced: their rows run in waves instead;
- greedy (`temperature == 0`) takes the argmax, so runs are deterministic on one machine; sampling
  draws from a `torch.Generator` per request, seeded by `seed` (fresh entropy when None);
- a row stops at the base's end-of-turn token ("stop", the token counted but not in the text), at
  a `stop` string ("stop", text cut before it), or at `max_tokens` / the base's context ("length").
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from catalog.bases import BaseModelSpec
from pipelines.engine import Engine, GenRequest, GenResult, SamplingParams, end_of_turn_ids
from pipelines.render import render_generation_prompt

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


def render_prompt(messages: list[dict], tokenizer, base: BaseModelSpec, line_no: int = 0) -> list[int]:
    """Prompt ids: the trainer's rendering with the generation prompt, tokenized as the trainer
    tokenizes (no special tokens added: the templates write their own BOS). Raises InvalidRequest."""
    text = render_generation_prompt(messages, tokenizer, base, line_no)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_engine(
    base: BaseModelSpec,
    *,
    model_source: str,
    cache_root: str,
    adapters: dict[str, dict[str, bytes]],
    kind: str = "transformers",
    max_batch_rows: int = 16,
) -> Engine:
    """The base once, with every adapter of `adapters` (peft-format files by name) loaded onto it."""
    if kind == "vllm":
        from pipelines._vllm_engine import load_vllm_engine

        return load_vllm_engine(base, model_source=model_source, cache_root=cache_root, adapters=adapters, max_batch_rows=max_batch_rows)
    if kind != "transformers":
        raise ValueError(f"batch engine {kind!r} is not one of: transformers, vllm.")
    from catalog.model_source import load_model, load_tokenizer, parse_model_source

    source = parse_model_source(model_source)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    # fp32 on CPU as training evaluates there; bf16 on GPU like training's autocast.
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = load_tokenizer(base, source, Path(cache_root))
    model = load_model(base, source, Path(cache_root), dtype=dtype)
    if adapters:
        from peft import PeftModel

        with tempfile.TemporaryDirectory(prefix="openft-adapters-") as tmp:
            # peft names modules after adapters, so ours (`ft:...`, with dots) are loaded under aliases.
            for i, (name, files) in enumerate(sorted(adapters.items())):
                directory = Path(tmp) / f"a{i}"
                directory.mkdir()
                for filename, data in files.items():
                    (directory / Path(filename).name).write_bytes(data)
                if i == 0:
                    model = PeftModel.from_pretrained(model, directory, adapter_name=f"a{i}", is_trainable=False)
                else:
                    model.load_adapter(directory, adapter_name=f"a{i}", is_trainable=False)
    model.to(device).eval()
    aliases = {name: f"a{i}" for i, name in enumerate(sorted(adapters))}
    return TransformersEngine(model, tokenizer, base, max_batch_rows=max_batch_rows, aliases=aliases)


@dataclass
class _Row:
    request: GenRequest
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    length: int = 0  # tokens in the cache that belong to this row (prompt + generated so far)


class TransformersEngine:
    """The batched decode loop over `model` (a peft model with named adapters, or a plain model)."""

    def __init__(self, model, tokenizer, base: BaseModelSpec, *, max_batch_rows: int = 16, aliases: dict[str, str] | None = None):
        self.model, self.tokenizer, self.base = model, tokenizer, base
        self.max_batch_rows = max(1, max_batch_rows)
        self.eot = set(end_of_turn_ids(tokenizer, base))
        self.device = next(model.parameters()).device
        self._peft = hasattr(model, "peft_config")
        # Request adapter name -> peft adapter name; by default the peft names themselves.
        self.aliases = aliases if aliases is not None else {n: n for n in getattr(model, "peft_config", {})}
        self._step_adapters: list[str] | None = None
        if self._peft:
            # peft's own `adapter_names=` path registers a hook on every LoRA layer per forward
            # (a walk over all modules each decode step: a third of a step's time on the stand-in);
            # one standing hook per layer passes the step's names the same way.
            from peft.tuners.lora import LoraLayer

            for module in model.modules():
                if isinstance(module, LoraLayer):
                    module.register_forward_pre_hook(self._inject_adapters, with_kwargs=True)

    def generate(self, requests: Sequence[GenRequest], should_stop: Callable[[], bool] | None = None) -> list[GenResult]:
        for r in requests:
            if r.adapter is not None and r.adapter not in self.aliases:
                raise ValueError(f"adapter {r.adapter!r} is not loaded on this engine")
            if not r.prompt_ids or r.params.max_tokens < 1:
                raise ValueError("every request needs a prompt and max_tokens >= 1")
        queue = sorted(requests, key=lambda r: (r.adapter or "", len(r.prompt_ids), r.key))
        queue.reverse()  # pop() from the end
        results: dict[int, GenResult] = {}
        with torch.inference_mode():
            self._run(queue, results, should_stop or (lambda: False))
        return [results[r.key] for r in requests if r.key in results]

    # --- the loop ---

    def _run(self, queue: list[GenRequest], results: dict[int, GenResult], should_stop: Callable[[], bool]) -> None:
        rows: list[_Row] = []
        cache = mask = None
        next_ids: list[int] = []
        solo = False  # a cache that cannot be spliced: one row at a time
        while (queue or rows) and not should_stop():
            while queue and len(rows) < (1 if solo else self.max_batch_rows):
                request = queue.pop()
                row = _Row(request, _generator(request.params), length=len(request.prompt_ids))
                row_cache, logits = self._prefill(request)
                solo = solo or not _spliceable(row_cache)
                cache, mask = _splice(cache, mask, row_cache, row.length, self.device)
                rows.append(row)
                next_ids.append(self._choose(row, logits))
            # Rows that are done after their last chosen token leave before the next step.
            keep = []
            for i, row in enumerate(rows):
                row.tokens.append(next_ids[i])
                result = self._finished(row)
                if result is None:
                    keep.append(i)
                else:
                    results[row.request.key] = result
            if not keep:
                rows, next_ids, cache, mask = [], [], None, None
                continue
            if len(keep) < len(rows):
                rows = [rows[i] for i in keep]
                next_ids = [next_ids[i] for i in keep]
                cache, mask = _select(cache, mask, keep)
                if queue:
                    continue  # refill the freed slots before the next step
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=self.device)], dim=1)
            logits = self._step(cache, mask, rows, next_ids)
            for row in rows:
                row.length += 1
            next_ids = [self._choose(row, logits[i]) for i, row in enumerate(rows)]

    def _inject_adapters(self, module, args, kwargs):
        if self._step_adapters is not None:
            kwargs["adapter_names"] = self._step_adapters
        return args, kwargs

    def _forward(self, adapters: list[str | None], **kwargs):
        if not self._peft:
            return self.model(**kwargs)
        self._step_adapters = [self.aliases[n] if n is not None else BASE_ADAPTER for n in adapters]
        try:
            return self.model(**kwargs)
        finally:
            self._step_adapters = None  # another engine may share the model

    def _prefill(self, request: GenRequest):
        from transformers import DynamicCache

        ids = torch.tensor([request.prompt_ids], device=self.device)
        cache = DynamicCache(config=self.model.config)
        out = self._forward([request.adapter], input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return cache, out.logits[0, -1]  # the cache is filled in place

    def _step(self, cache, mask, rows: list[_Row], next_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([[t] for t in next_ids], device=self.device)
        positions = torch.tensor([[row.length] for row in rows], device=self.device)
        out = self._forward([r.request.adapter for r in rows], input_ids=ids, attention_mask=mask, position_ids=positions,
                            cache=cache, use_cache=True)  # fmt: skip
        return out.logits[:, -1]

    def _choose(self, row: _Row, logits: torch.Tensor) -> int:
        params = row.request.params
        logits = logits.float()
        if params.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest head whose mass reaches top_p (the first token always).
            drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs.cpu(), 1, generator=row.generator))

    def _finished(self, row: _Row) -> GenResult | None:
        params, token = row.request.params, row.tokens[-1]
        if token in self.eot:
            return self._result(row, "stop", row.tokens[:-1])
        if params.stop:
            text = self._text(row.tokens)
            cut = min((i for i in (text.find(s) for s in params.stop if s) if i >= 0), default=-1)
            if cut >= 0:
                return self._result(row, "stop", None, text[:cut])
        context_full = len(row.request.prompt_ids) + len(row.tokens) >= self.base.max_seq_length
        if len(row.tokens) >= params.max_tokens or context_full:
            return self._result(row, "length", row.tokens)
        return None

    def _text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _result(self, row: _Row, reason: str, text_ids: list[int] | None, text: str | None = None) -> GenResult:
        return GenResult(
            key=row.request.key,
            token_ids=tuple(row.tokens),
            text=self._text(text_ids) if text is None else text,
            finish_reason=reason,
            prompt_tokens=len(row.request.prompt_ids),
            completion_tokens=len(row.tokens),
        )


def _generator(params: SamplingParams) -> torch.Generator | None:
    if params.temperature <= 0:
        return None
    return torch.Generator().manual_seed(params.seed if params.seed is not None else secrets.randbits(63))


def _spliceable(cache) -> bool:
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _splice(cache, mask, row_cache, row_length: int, device):
    """Append a freshly prefilled one-row cache to the batch's cache, left-padding the shorter side."""
    row_mask = torch.ones((1, row_length), dtype=torch.long, device=device)
    if cache is None:
        return row_cache, row_mask
    total = max(mask.shape[1], row_length)
    for layer, new in zip(cache.layers, row_cache.layers):
        layer.keys = torch.cat([_pad_left(layer.keys, total), _pad_left(new.keys, total)], dim=0)
        layer.values = torch.cat([_pad_left(layer.values, total), _pad_left(new.values, total)], dim=0)
    mask = torch.cat([_pad_left(mask, total, dim=1), _pad_left(row_mask, total, dim=1)], dim=0)
    return cache, mask


def _pad_left(t: torch.Tensor, total: int, dim: int = -2) -> torch.Tensor:
    missing = total - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _select(cache, mask, keep: list[int]):
    """Keep rows `keep` of the batch and drop the leading columns none of them uses."""
    index = torch.tensor(keep, device=mask.device)
    mask = mask[index]
    used = mask.any(dim=0).nonzero()
    start = int(used[0]) if len(used) else 0
    mask = mask[:, start:]
    for layer in cache.layers:
        layer.keys = layer.keys[index, :, start:]
        layer.values = layer.values[index, :, start:]
    return cache, mask
