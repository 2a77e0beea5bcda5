"""Batch generation: prompt rendering and a multi-LoRA engine over one base. Pure, no Ray.

`pipelines/batch_ray.py` holds one engine per Ray actor; the serving-parity check
(train/parity.py) uses the same engine. An `Engine` (pipelines/engine.py, the contract both
engines implement) takes `GenRequest`s (prompt ids, the adapter by name, sampling params) and
returns one `GenResult` per request, in request order; `load_engine` picks the transformers
engine here or the vLLM one (pipelines/_vllm_engine.py).

The transformers engine (`TransformersEngine`) is our own decode loop, not `model.generate`:
- the base is loaded once and every adapter of the batch is loaded onto it by name (peft
  `load_adapter`); a decode step runs rows of different adapters together: with
  `stack_adapters` as two matrix products per LoRA layer over every resident adapter
  (pipelines/lora_stack.py; who trains an adapter between generations calls
  `adapter_weights_changed`), otherwise through peft's mixed-adapter forward
  (`adapter_names=[...]`, one name per row, "__base__" for the base alone);
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
from catalog.model_source import import_peft
from pipelines.answer_format import AnswerConstraint
from pipelines.engine import Engine, GenRequest, GenResult, SamplingParams, end_of_turn_ids
from pipelines.lora_stack import StackedLora
from openft.errors import InvalidRequest
from pipelines.render import render_generation_prompt

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


def render_prompt(messages: list[dict], tokenizer, base: BaseModelSpec, line_no: int = 0) -> list[int]:
    """Prompt ids: the trainer's rendering with the generation prompt, tokenized as the trainer
    tokenizes (no special tokens added: the templates write their own BOS). Raises InvalidRequest."""
    text = render_generation_prompt(messages, tokenizer, base, line_no)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_for(messages: list[dict], max_tokens: int | None, tokenizer, base: BaseModelSpec, line_no: int = 0,
               where: str = "") -> tuple[list[int], int]:
    """(prompt ids, max tokens) of a chat request: `max_tokens` None takes the context that is left.
    Raises InvalidRequest `context_length_exceeded` when the prompt and `max_tokens` exceed the
    base's context, before anything runs (`where` opens the message, e.g. "line 4: ")."""
    ids = render_prompt(messages, tokenizer, base, line_no)
    room = base.max_seq_length - len(ids)
    max_tokens = max_tokens if max_tokens is not None else room
    if max_tokens > room or room < 1:
        raise InvalidRequest(
            f"{where}the prompt's {len(ids)} tokens and max_tokens {max_tokens} exceed the {base.max_seq_length}-token "
            f"context of {base.id}; shorten the messages or lower max_tokens.",
            code="context_length_exceeded", param="body.messages")  # fmt: skip
    return ids, max_tokens


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
    model = load_model(base, source, Path(cache_root), dtype=dtype).to(device).eval()
    engine = TransformersEngine(model, tokenizer, base, max_batch_rows=max_batch_rows, stack_adapters=True)
    for name, files in sorted(adapters.items()):
        engine.add_adapter(name, files)
    return engine


@dataclass
class _Row:
    request: GenRequest
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    length: int = 0  # tokens in the cache that belong to this row (prompt + generated so far)
    next_id: int | None = None  # the token chosen for the row and not yet taken into `tokens`


class TransformersEngine:
    """The batched decode loop over `model` (a peft model with named adapters, or a plain model)."""

    def __init__(self, model, tokenizer, base: BaseModelSpec, *, max_batch_rows: int = 16, aliases: dict[str, str] | None = None,
                 stack_adapters: bool = False):
        self.model, self.tokenizer, self.base = model, tokenizer, base
        self.max_batch_rows = max(1, max_batch_rows)
        self.eot = set(end_of_turn_ids(tokenizer, base))
        self.device = next(model.parameters()).device
        # Request adapter name -> peft adapter name; by default the peft names themselves.
        self.aliases = aliases if aliases is not None else {n: n for n in getattr(model, "peft_config", {})}
        self._step_adapters: list[str] | None = None
        self._hooked: set[int] = set()
        self._next_alias = len(self.aliases)
        self._stack = StackedLora() if stack_adapters else None
        self._answers = AnswerConstraint(tokenizer, sorted(self.eot))
        self._hook_lora_layers()

    @property
    def _peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def _hook_lora_layers(self) -> None:
        # peft's own `adapter_names=` path registers a hook on every LoRA layer per forward (a walk
        # over all modules each decode step: a third of a step's time on the stand-in); one standing
        # hook per layer passes the step's names the same way. Layers an adapter added are hooked too.
        if not self._peft:
            return
        LoraLayer = import_peft().tuners.lora.LoraLayer  # noqa: N806 (the class)
        for module in self.model.modules():
            if isinstance(module, LoraLayer) and id(module) not in self._hooked:
                module.register_forward_pre_hook(self._inject_adapters, with_kwargs=True)
                self._hooked.add(id(module))
        if self._stack is not None:
            self._stack.reset(self.model)

    def add_adapter(self, name: str, files: dict[str, bytes]) -> None:
        """Load a peft-format adapter (its files by name) onto the base under `name`. Not while a
        `generate` or `DecodeLoop.advance` runs: the caller serialises them (online/engine.py runs
        both on its one engine thread)."""
        PeftModel = import_peft().PeftModel  # noqa: N806 (the class)
        # peft names modules after adapters, so ours (`ft:...`, with dots) are loaded under aliases.
        alias = f"a{self._next_alias}"
        self._next_alias += 1
        with tempfile.TemporaryDirectory(prefix="openft-adapters-") as tmp:
            for filename, data in files.items():
                (Path(tmp) / Path(filename).name).write_bytes(data)
            if self._peft:
                self.model.load_adapter(tmp, adapter_name=alias, is_trainable=False)
            else:
                self.model = PeftModel.from_pretrained(self.model, tmp, adapter_name=alias, is_trainable=False)
        if self.model.active_adapter not in self.model.peft_config:
            # Every adapter was removed before this one (online serving): peft still names the last one
            # active, and its forward reads that adapter's config even when rows name theirs.
            self.model.set_adapter(alias)
        self.model.eval()
        self.aliases[name] = alias
        self._hook_lora_layers()

    def remove_adapter(self, name: str) -> None:
        """Unload `name` (no row of it may be decoding); its LoRA weights are freed."""
        self.model.delete_adapter(self.aliases.pop(name))
        if self._stack is not None:
            self._stack.reset(self.model)

    def adapter_weights_changed(self) -> None:
        """Adapter weights were changed in place (an optimizer step): the next forward reads them anew."""
        if self._stack is not None:
            self._stack.refresh()

    def check(self, request: GenRequest) -> None:
        if request.adapter is not None and request.adapter not in self.aliases:
            raise ValueError(f"adapter {request.adapter!r} is not loaded on this engine")
        if not request.prompt_ids or request.params.max_tokens < 1:
            raise ValueError("every request needs a prompt and max_tokens >= 1")

    def generate(self, requests: Sequence[GenRequest], should_stop: Callable[[], bool] | None = None) -> list[GenResult]:
        for r in requests:
            self.check(r)
        queue = sorted(requests, key=lambda r: (r.adapter or "", len(r.prompt_ids), r.key))
        queue.reverse()  # pop() from the end
        results: dict[int, GenResult] = {}
        loop = DecodeLoop(self, queue, on_result=lambda result: results.__setitem__(result.key, result))
        should_stop = should_stop or (lambda: False)
        with torch.inference_mode():
            while loop.busy and not should_stop():
                loop.advance()
        return [results[r.key] for r in requests if r.key in results]

    def _inject_adapters(self, module, args, kwargs):
        if self._step_adapters is not None:
            kwargs["adapter_names"] = self._step_adapters
        return args, kwargs

    def _forward(self, adapters: list[str | None], **kwargs):
        if not self._peft:
            return self.model(**kwargs)
        if not self.model.peft_config:  # every adapter was removed (online serving): the base alone
            return self.model.base_model.model(**kwargs)
        if self._stack is not None and self._stack.usable:
            self._stack.set_rows([self.aliases[n] if n is not None else None for n in adapters], self.device)
            self._stack.active = True
        else:
            self._step_adapters = [self.aliases[n] if n is not None else BASE_ADAPTER for n in adapters]
        try:
            return self.model(**kwargs)
        finally:
            self._step_adapters = None  # another engine may share the model
            if self._stack is not None:
                self._stack.active = False

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
        if params.answer is not None:
            allowed = torch.tensor(self._answers.allowed(params.answer, row.tokens), device=logits.device)
            logits = torch.full_like(logits, float("-inf")).index_copy_(0, allowed, logits[allowed])
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


class DecodeLoop:
    """The rows decoding together on one KV cache. Each `advance` is one step of the loop: free
    slots are filled from `queue` (its `pop()` gives the next request; batches pop a sorted list,
    online serving a FIFO that callers fill between steps), every row takes the token chosen for
    it, once, finished rows leave (`on_result`), and the rest decode one more token. `on_token(row)`
    sees each unfinished row after it took a token (online streaming reads `row.tokens`).

    A step that freed slots while requests wait ends before decoding: the next one fills the slots
    first, and its rows that took their token already feed that token, unchanged, to the decode.
    (Before issue 27 they took it a second time on the refill step, so on a batch of more requests
    than slots a row could write its last token twice: "deliveryivery".)"""

    def __init__(self, engine: TransformersEngine, queue, *, on_result: Callable[[GenResult], None],
                 on_token: Callable[[_Row], None] | None = None):
        self.engine, self.queue, self.on_result, self.on_token = engine, queue, on_result, on_token
        self.rows: list[_Row] = []
        self.cache = self.mask = None
        self.solo = False  # a cache that cannot be spliced: one row at a time

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.rows)

    def advance(self) -> None:
        e = self.engine
        while self.queue and len(self.rows) < (1 if self.solo else e.max_batch_rows):
            request = self.queue.pop()
            row = _Row(request, _generator(request.params), length=len(request.prompt_ids))
            row_cache, logits = e._prefill(request)
            self.solo = self.solo or not _spliceable(row_cache)
            self.cache, self.mask = _splice(self.cache, self.mask, row_cache, row.length, e.device)
            row.next_id = e._choose(row, logits)
            self.rows.append(row)
        # Rows that are done after their chosen token leave before the next step.
        keep = []
        for i, row in enumerate(self.rows):
            if row.next_id is not None:
                row.tokens.append(row.next_id)
                row.next_id = None
                result = e._finished(row)
                if result is not None:
                    self.on_result(result)
                    continue
                if self.on_token is not None:
                    self.on_token(row)
            keep.append(i)
        if len(keep) < len(self.rows):
            self._keep(keep)
            if self.queue or not self.rows:
                return  # refill the freed slots before the next step
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=e.device)], dim=1)
        logits = e._step(self.cache, self.mask, self.rows, [row.tokens[-1] for row in self.rows])
        for i, row in enumerate(self.rows):
            row.length += 1
            row.next_id = e._choose(row, logits[i])

    def drop(self, keys: set[int]) -> None:
        """Take the rows of `keys` out of the batch (their clients left); they return no result."""
        keep = [i for i, row in enumerate(self.rows) if row.request.key not in keys]
        if len(keep) < len(self.rows):
            self._keep(keep)

    def _keep(self, keep: list[int]) -> None:
        if not keep:
            self.rows, self.cache, self.mask, self.solo = [], None, None, False
            return
        self.rows = [self.rows[i] for i in keep]
        self.cache, self.mask = _select(self.cache, self.mask, keep)


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
