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


def batch_request_line(
    custom_id: str, messages: list[dict] | None = None, model: str = "gpt-4o-mini", **body_fields: Any
) -> dict[str, Any]:
    """One line of an OpenAI batch input file (chat completions); `body_fields` join the body."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages or [message("user", "Summarise the ticket.")], **body_fields},
    }


def batch_result_line(
    custom_id: str,
    content: str | None = "Done.",
    *,
    finish_reason: str = "stop",
    status_code: int = 200,
    **message_fields: Any,
) -> dict[str, Any]:
    """One line of an OpenAI batch output file with a chat completion answer (`refusal=...` and
    other `message_fields` go on the answer's message)."""
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": f"req_{custom_id}",
            "body": {
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": message("assistant", content, **message_fields), "finish_reason": finish_reason}
                ],
            },
        },
        "error": None,
    }


def batch_error_line(custom_id: str, code: str = "server_error") -> dict[str, Any]:
    """One line of an OpenAI batch output file for a request that failed before any response."""
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": "The request failed."},
    }


def anthropic_request_line(
    custom_id: str,
    messages: list[dict] | None = None,
    *,
    system: Any = None,
    model: str = "claude-sonnet-4-5",
    max_tokens: int = 1024,
    **params: Any,
) -> dict[str, Any]:
    """One request of an Anthropic Message Batch; `system` may be a string or text blocks."""
    body = {"model": model, "max_tokens": max_tokens, "messages": messages or [message("user", "Summarise the ticket.")]}
    if system is not None:
        body["system"] = system
    return {"custom_id": custom_id, "params": {**body, **params}}


def anthropic_result_line(
    custom_id: str, text: str | list[dict] = "Done.", *, stop_reason: str = "end_turn", result_type: str = "succeeded"
) -> dict[str, Any]:
    """One line of an Anthropic Message Batch's results; `text` may be content blocks."""
    if result_type != "succeeded":
        error = {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
        return {"custom_id": custom_id, "result": {"type": result_type, **({"error": error} if result_type == "errored" else {})}}
    blocks = [{"type": "text", "text": text}] if isinstance(text, str) else text
    return {
        "custom_id": custom_id,
        "result": {
            "type": "succeeded",
            "message": {
                "id": f"msg_{custom_id}",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": 20, "output_tokens": 10},
            },
        },
    }


def jsonl(rows: Iterable[dict[str, Any] | bytes], *, newline: bytes = b"\n", final_newline: bool = True) -> bytes:
    """File bytes, one row per line; a bytes item is written as the line verbatim (for broken lines)."""
    lines = [r if isinstance(r, bytes) else orjson.dumps(r) for r in rows]
    return newline.join(lines) + (newline if final_newline and lines else b"")


DISTILL_CASES = ("ok", "prose", "errored", "refused", "truncated", "empty", "no_request", "not_convertible", "too_large")
_WORDS = "the parcel refund invoice ticket delivery address “quoted” naïve 東京 line\nbreak tab\t\"q\" back\\slash".split(" ")


def distill_files(fmt: str, n: int, seed: int = 0) -> tuple[bytes, bytes, list[str]]:
    """A batch's results and requests files ("openai" or "anthropic"), n results, every case of
    DISTILL_CASES present, and the case of each result line in file order. "ok" answers are JSON
    objects, "prose" and truncated ones are not. Requests come in another order than results,
    and a few requests have no result."""
    import random

    rng = random.Random(seed)
    weights = (60, 10, 6, 4, 6, 4, 3, 6, 0)
    cases = [rng.choices(DISTILL_CASES, weights)[0] for _ in range(n)]
    for i, case in enumerate(DISTILL_CASES):
        cases[i * 7 % n] = case  # each at least once (too_large only here: its lines are 1 MiB)

    def text(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k))

    request = batch_request_line if fmt == "openai" else anthropic_request_line
    results, requests = [], []
    for i, case in enumerate(cases):
        cid = f"req-{i:06d}"
        turns = [message("user", text(rng.randint(5, 60)))]
        if rng.random() < 0.2:
            turns = [message("user", text(8)), message("assistant", text(8))] + turns
        if case == "too_large":
            turns = [message("user", "x" * 700_000)]
        kw: dict[str, Any] = {}
        if case == "not_convertible":
            kw = {"tools": [{"name": "lookup"}]} if i % 2 else {}
            if not kw:
                image = {"type": "image_url", "image_url": {"url": "https://x"}} if fmt == "openai" else {"type": "image"}
                turns[-1] = message("user", [{"type": "text", "text": "what is it?"}, image])
        if fmt == "openai":
            turns = ([message("system", text(6))] if rng.random() < 0.7 else []) + turns
        else:
            kw["system"] = text(6) if i % 3 else [{"type": "text", "text": text(4)}, {"type": "text", "text": text(3)}]
        if case != "no_request":
            requests.append(request(cid, turns, **kw))
        answer = orjson.dumps({"label": rng.choice(_WORDS), "score": i}).decode() if case == "ok" else text(rng.randint(3, 80))
        if case == "too_large":
            answer = "y" * 400_000
        if fmt == "openai":
            if case == "errored":
                line = batch_error_line(cid) if i % 2 else batch_result_line(cid, None, status_code=500)
            elif case == "refused":
                line = batch_result_line(cid, None, refusal="I can't help with that.")
            else:
                empty = case == "empty"
                finish = "length" if case == "truncated" else "stop"
                line = batch_result_line(cid, rng.choice(["", " \n"]) if empty else answer, finish_reason=finish, refusal=None)
        else:
            if case == "errored":
                line = anthropic_result_line(cid, result_type=rng.choice(["errored", "canceled", "expired"]))
            elif case == "refused":
                line = anthropic_result_line(cid, "", stop_reason="refusal")
            elif case == "empty":
                line = anthropic_result_line(cid, [])
            else:
                line = anthropic_result_line(cid, answer, stop_reason="max_tokens" if case == "truncated" else "end_turn")
        results.append(line)
    requests += [request(f"extra-{i}") for i in range(3)]
    rng.shuffle(requests)
    return jsonl(results), jsonl(requests), cases


def create_jobs_in_parallel(client, n: int, **create) -> list:
    """`n` concurrent `jobs.create` calls; each result is a job or the RateLimitError it raised."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    def one(_):
        try:
            return client.fine_tuning.jobs.create(**create)
        except openai.RateLimitError as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def reinforcement_method() -> dict:
    """OpenAI's reinforcement create example's `method` (which the reference refuses and this service takes)."""
    from openai.types.fine_tuning import ReinforcementHyperparameters, ReinforcementMethod
    from openai.types.graders import StringCheckGrader

    return {
        "type": "reinforcement",
        "reinforcement": ReinforcementMethod(
            grader=StringCheckGrader(
                name="Example string check grader", type="string_check", input="{{item.label}}",
                operation="eq", reference="{{sample.output_text}}",
            ),
            hyperparameters=ReinforcementHyperparameters(reasoning_effort="medium"),
        ),
    }


# -- accounts, files and jobs straight in the database (tests of the job package and controller) --
JOB_MODEL = "qwen2.5-0.5b-instruct"


def db_account(db, *, open_jobs: int = 3, deposit_usd: str | None = None) -> str:
    """An account (and, billing on, its deposit) through the repositories the CLI uses."""
    import time
    import uuid

    from storage import billing
    from storage.accounts import create_account

    with db.session() as session:
        account, _ = create_account(session, f"acct-{uuid.uuid4().hex[:8]}", open_jobs_limit=open_jobs)
        if deposit_usd:
            billing.deposit(session, account, billing.to_cents(deposit_usd), int(time.time()))
        return account.id


def db_training_file(db, account_id: str) -> str:
    """A processed training file's row (scripted runs never read its bytes)."""
    import time

    from openft.ids import file_id
    from storage import keys
    from storage.models import File

    fid, now = file_id(), int(time.time())
    with db.session() as session:
        session.add(File(id=fid, account_id=account_id, filename="train.jsonl", purpose="fine-tune", bytes=100,
                         created_at=now, created_ns=time.time_ns(), status="processed", sha256="0" * 64,
                         object_key=keys.upload(account_id, fid), stats={}))
    return fid


def job_spec(training_file: str, **overrides) -> dict:
    from jobs.spec import JobSpec

    fields = dict(model=JOB_MODEL, method_type="supervised", adapter="lora", n_epochs=1, batch_size=1,
                  learning_rate=1e-3, learning_rate_multiplier=None, lora_rank=8, lora_alpha=16, max_seq_length=256,
                  beta=None, seed=0, metadata={}, suffix=None, training_file=training_file, validation_file=None)
    return JobSpec(**{**fields, **overrides}).record()


def db_create_job(db, account_id: str, training_file: str, *, max_charge_usd: float = 1.00, now: int | None = None,
                  created_at: int | None = None):
    """The locked part of job create (serve_app/services/fine_tuning_jobs.create_job): under the
    account's lock, the open-job limit, the row, its first event and admission. Returns the job id,
    or the RateLimited refusal."""
    import time

    from sqlalchemy import select

    from jobs import limits, transitions
    from openft.errors import RateLimited
    from openft.ids import job_id
    from storage.models import Account, Job

    now = now or int(time.time())
    with db.session() as session:
        account = session.scalar(select(Account).where(Account.id == account_id).with_for_update())
        try:
            limits.check_open_jobs(session, account)
        except RateLimited as refusal:
            return refusal
        job = Job(id=job_id(), account_id=account_id, model=JOB_MODEL,
                  created_at=created_at or now, created_ns=time.time_ns(), training_file=training_file, seed=0,
                  spec=job_spec(training_file), quote={"per_token": {"trained_usd_per_mtok": 0.40, "minimum_usd": 0.50,
                                                                     "max_charge_usd": max_charge_usd}},
                  result_files=[], updated_at=now)
        transitions.add_new(session, job, now)
        transitions.admit(session, job, now)
        return job.id


def db_ft_model(db, store, account_id: str, files: dict[str, bytes] | None = None) -> str:
    """A registered `ft:` model (its row and adapter objects, as the controller stores them after a
    job) without training one; returns its name."""
    import hashlib
    import time

    from openft.ids import job_id
    from storage.models import Account, FineTunedModel
    from jobs.model_names import model_name

    files = files or {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": b"\0" * 64}
    job = job_id()
    prefix = f"runs/{job}/adapter"
    for name, data in files.items():
        store.put_bytes(f"{prefix}/{name}", data)
    with db.session() as session:
        name = model_name(JOB_MODEL, session.get(Account, account_id).org_id, job)
        session.add(FineTunedModel(
            id=name, account_id=account_id, job_id=job, base=JOB_MODEL, servable=True, adapter_prefix=prefix,
            files={n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in files.items()},
            created_at=int(time.time()), created_ns=time.time_ns(),
        ))  # fmt: skip
    return name


def db_export(db, store, account_id: str, model: str, files: dict[str, bytes]) -> str:
    """A succeeded merge of `model` holding `files` (path -> bytes), as the merge worker records
    one; returns its export prefix."""
    import hashlib
    import time

    from openft.ids import new_id
    from storage import keys
    from storage.models import Merge

    now, merge_id = int(time.time()), new_id("merge-", 24)
    prefix = keys.merge_export(account_id, merge_id)
    for path, data in files.items():
        store.put_bytes(f"{prefix}/{path}", data)
    listed = [{"path": p, "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in files.items()]
    with db.session() as session:
        session.add(Merge(
            id=merge_id, account_id=account_id, model=model, base=JOB_MODEL, status="succeeded", export_prefix=prefix,
            adapter_sha256={}, attempts=1, files=listed, bytes=sum(len(d) for d in files.values()),
            delete_requested=False, created_at=now, created_ns=time.time_ns(), finished_at=now, expires_at=now + 86400,
        ))  # fmt: skip
    return prefix


def db_stored_file(settings, account_id: str, data: bytes, *, purpose: str = "fine-tune", stats: dict) -> str:
    """A file's bytes in the store and its row in the files table, straight past the upload's
    checks: what a validation bypass would have stored."""
    import hashlib
    import time

    from openft.ids import file_id
    from storage import keys
    from storage.db import Database
    from storage.models import File
    from storage.objects import open_object_store

    fid, now = file_id(), int(time.time())
    key = keys.upload(account_id, fid)
    open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                      s3_region=settings.s3_region).put_bytes(key, data)
    db = Database(settings.resolved_database_url())
    try:
        with db.session() as session:
            session.add(File(id=fid, account_id=account_id, filename="swapped.jsonl", purpose=purpose, bytes=len(data),
                             created_at=now, created_ns=time.time_ns(), status="processed",
                             sha256=hashlib.sha256(data).hexdigest(), object_key=key, stats=stats))
    finally:
        db.dispose()
    return fid


# -- batches (issue 13, h1): tiny peft adapters for the batch engine --


def random_adapter(base, cache_root, seed: int, rank: int = 8) -> dict[str, bytes]:
    """A peft LoRA adapter for `base`'s stand-in with random (non-zero) A and B, so it changes the
    base's answers; its files as train/lora.py `adapter_files` writes them."""
    from pathlib import Path

    import torch
    from peft import LoraConfig, get_peft_model

    from catalog.model_source import ModelSource, load_model
    from train.lora import TARGET_MODULES, adapter_files

    model = load_model(base, ModelSource("standin"), Path(cache_root))
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGET_MODULES[base.family],
                        init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
    return adapter_files(get_peft_model(model, config), base)


# -- checkpoints as models (issue 13) --
def db_job_with_checkpoints(db, account_id: str, steps: list[int], *, register: bool = True,
                            model: str = JOB_MODEL) -> tuple[str, str]:
    """A job (on `model`) that recorded a "Checkpoint saved" event per step, as train/loop.py writes
    them, and, with `register`, its registered `ft:` model. Returns (job id, ft name)."""
    import time

    from jobs.model_names import job_model_name
    from storage import jobs as jobs_repo
    from storage.models import FineTunedModel, Job

    job_id = db_create_job(db, account_id, db_training_file(db, account_id))
    now = int(time.time())
    with db.session() as session:
        job = session.get(Job, job_id)
        job.model = model
        for step in steps:
            jobs_repo.add_event(session, job_id, now, f"Checkpoint saved at step {step}.",
                                data={"checkpoint": {"step": step, "epoch": 1, "train_loss": 0.5}})
        name = job_model_name(session, job)
        if register:
            from catalog.bases import BASES

            base = BASES[model]
            session.add(FineTunedModel(
                id=name, account_id=account_id, job_id=job_id, base=model, servable=base.servable,
                reason=base.not_servable_reason, adapter_prefix=f"runs/{job_id}/adapter", files={},
                created_at=now, created_ns=time.time_ns(),
            ))  # fmt: skip
    return job_id, name
