"""What a generation engine takes and returns, shared by the transformers engine
(pipelines/generate.py) and the vLLM one (pipelines/_vllm_engine.py): the requests, the results,
the `Engine` protocol, and the base's and the adapter's facts both need. Pure, no torch, no Ray."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from catalog.bases import BaseModelSpec
from graders.model_graders import ChoiceAnswer, NumberAnswer


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 => greedy (deterministic)
    top_p: float = 1.0
    seed: int | None = None  # per-request generator seed when sampling
    stop: tuple[str, ...] = ()  # extra stop strings (OpenAI `stop`); the base's end-of-turn always stops
    answer: NumberAnswer | ChoiceAnswer | None = None  # the form the answer must take (model graders)


@dataclass(frozen=True)
class GenRequest:
    key: int  # caller's row index; results come back with it
    adapter: str | None  # adapter name as loaded (None = the base alone)
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class GenResult:
    key: int
    token_ids: tuple[int, ...]  # completion tokens (a closing end-of-turn token included)
    text: str  # the end-of-turn token and anything from a stop string on excluded
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int  # counted with the base's tokenizer: len(token_ids)


class Engine(Protocol):
    def generate(self, requests: Sequence[GenRequest], should_stop: Callable[[], bool] | None = None) -> list[GenResult]:
        """One result per request in request order; when `should_stop()` turns True (it is polled
        between decode steps) only the rows finished by then come back."""
        ...


def end_of_turn_ids(tokenizer, base: BaseModelSpec) -> tuple[int, ...]:
    """The id of the token that closes an assistant turn of the last message (what training taught)."""
    token_id = tokenizer.convert_tokens_to_ids(base.end_of_turn)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"The tokenizer of {base.id} has no {base.end_of_turn} token.")
    return (token_id,)


def adapter_rank(files: dict[str, bytes]) -> int:
    return int(json.loads(files["adapter_config.json"])["r"])
