"""Factories for test data: training rows, batch lines and the JSONL bytes of files.

Rows are plain dicts in OpenAI's wire formats; `jsonl` turns any of them into file bytes.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson


def message(role: str, content: Any = "Hello.", **fields: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **fields}


def chat_row(
    *turns: str, system: str | None = "You are terse.", extra_messages: Iterable[dict] = (), **fields: Any
) -> dict[str, Any]:
    """A chat row: optional system message, then `turns` alternating user/assistant (default one pair)."""
    turns = turns or ("Where is my parcel?", "It left the depot this morning.")
    messages = [message("system", system)] if system is not None else []
    messages += [message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns)]
    messages += list(extra_messages)
    return {"messages": messages, **fields}


def preference_row(
    prompt: str = "Capital of France?",
    preferred: str = "Paris.",
    non_preferred: str = "Lyon.",
    *,
    system: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    messages = ([message("system", system)] if system is not None else []) + [message("user", prompt)]
    return {
        "input": {"messages": messages},
        "preferred_output": [message("assistant", preferred)],
        "non_preferred_output": [message("assistant", non_preferred)],
        **fields,
    }


def batch_request_line(custom_id: str, messages: list[dict] | None = None, model: str = "gpt-4o-mini") -> dict[str, Any]:
    """One line of an OpenAI batch input file (chat completions)."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages or [message("user", "Summarise the ticket.")]},
    }


def batch_result_line(
    custom_id: str, content: str = "Done.", *, finish_reason: str = "stop", status_code: int = 200
) -> dict[str, Any]:
    """One line of an OpenAI batch output file with a chat completion answer."""
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": f"req_{custom_id}",
            "body": {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message("assistant", content), "finish_reason": finish_reason}],
            },
        },
        "error": None,
    }


def jsonl(rows: Iterable[dict[str, Any] | bytes], *, newline: bytes = b"\n", final_newline: bool = True) -> bytes:
    """File bytes, one row per line; a bytes item is written as the line verbatim (for broken lines)."""
    lines = [r if isinstance(r, bytes) else orjson.dumps(r) for r in rows]
    return newline.join(lines) + (newline if final_newline and lines else b"")
