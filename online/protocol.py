"""What crosses from the API replica to a base's online replica and back, by value: the request
(prompt ids already rendered and checked by the API) and the deltas of its answer. No torch here:
the API imports it without the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OnlineRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int  # already cut to the context: the prompt plus this fits the base
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Delta:
    """A piece of an answer. The pieces' texts concatenate to the answer's whole text, the same text
    a non-streamed request of the same tokens gets; the last piece has `finish_reason` and usage."""

    text: str
    finish_reason: str | None = None  # "stop" | "length" on the last piece
    prompt_tokens: int = 0
    completion_tokens: int = 0  # generated so far (all of them on the last piece)


def deployment_name(base_id: str) -> str:
    """The Serve deployment of a base, as the Ray dashboard lists it."""
    return f"online-{base_id}"
