"""A chat completion and its streamed chunks (openai-python `ChatCompletion`, `ChatCompletionChunk`,
`CompletionUsage`), field for field as this service fills them: one choice, text only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

FinishReason = Literal["stop", "length"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    """No prompt cache here: always 0."""


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    """The rendered prompt's tokens, counted with the base's tokenizer."""
    completion_tokens: int
    """Generated tokens, the closing end-of-turn token included."""
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    completion_tokens_details: CompletionTokensDetails = CompletionTokensDetails()


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    """The answer's text: without the end-of-turn token, and cut before a `stop` string."""
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: FinishReason
    """`stop`: the model ended its turn or met a `stop` string; `length`: max_tokens or the context."""
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    """`chatcmpl-...`, the same in every chunk of a streamed answer."""
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    """The model as the request named it (a base, an ft: model or a checkpoint)."""
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: None = None
    service_tier: None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    """Set in the first chunk only."""
    content: str | None = None
    refusal: None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    """One choice; none in the usage chunk that `stream_options.include_usage` adds at the end."""
    usage: CompletionUsage | None = None
    """Null in every chunk but that last one (with include_usage)."""
    system_fingerprint: None = None
    service_tier: None = None
