"""`openft chat MODEL`: a conversation with a model in the terminal, each answer streamed as it is
generated (`client.chat.completions.create(stream=True)`, issue 27). Configured as the other user
commands (OPENAI_BASE_URL, OPENAI_API_KEY or the flags).

Each line typed is a user turn; the whole conversation goes with it, so the model sees what was said
before. `/reset` starts over, `/exit` or end of input (Ctrl-D) ends the command. A refusal of one
turn (`context_length_exceeded`, a rate limit) is printed like every API refusal and the turn is
dropped, the conversation goes on; a model that cannot answer at all (404, 400 model_not_available)
or a rejected key ends the command with status 1."""

from __future__ import annotations

import argparse
import sys

from entrypoints.user_jobs import api_client, describe_api_error

PROMPT = "you> "
_FATAL = {401, 403, 404}


def cmd_chat(args: argparse.Namespace) -> int:
    import openai

    client = api_client(args, max_retries=0)
    history = [{"role": "system", "content": args.system}] if args.system else []
    print(f"chat with {args.model}; /reset starts over, /exit or Ctrl-D ends", flush=True)
    while True:
        try:
            line = input(PROMPT)
        except EOFError:
            print()
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            history = history[:1] if args.system else []
            print("(conversation reset)", flush=True)
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = _stream_answer(client, args, history)
        except openai.APIStatusError as exc:
            history.pop()
            print(f"openft: {describe_api_error(exc)}", file=sys.stderr, flush=True)
            fatal = exc.status_code in _FATAL or (exc.body or {}).get("code") == "model_not_available"
            if fatal:
                return 1
            continue
        history.append({"role": "assistant", "content": answer})


def _stream_answer(client, args: argparse.Namespace, history: list[dict]) -> str:
    options = {k: v for k, v in (("max_tokens", args.max_tokens), ("temperature", args.temperature)) if v is not None}
    stream = client.chat.completions.create(model=args.model, messages=history, stream=True, **options)
    parts, finish = [], None
    print(f"{args.model}> ", end="", flush=True)
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
                print(choice.delta.content, end="", flush=True)
            finish = choice.finish_reason or finish
    print(" [cut at max tokens]" if finish == "length" else "", flush=True)
    return "".join(parts)


def add_chat_command(sub, leaf) -> None:
    connect = argparse.ArgumentParser(add_help=False)  # the other commands' flags but --json: a chat is text
    connect.add_argument("--base-url", default=None, help="the API's base URL (default: $OPENAI_BASE_URL)")
    connect.add_argument("--api-key", default=None, help="your API key (default: $OPENAI_API_KEY)")
    chat = leaf(sub, "chat", cmd_chat, "talk with a base or one of your ft: models, answers streamed", connect)
    chat.add_argument("model", help="a base, or one of your ft: models or checkpoints")
    chat.add_argument("--system", default=None, help="a system message that opens the conversation")
    chat.add_argument("--max-tokens", type=int, default=None, help="most tokens per answer (default: what the context leaves)")
    chat.add_argument("--temperature", type=float, default=None, help="0 answers greedily (default: the API's, 1)")
