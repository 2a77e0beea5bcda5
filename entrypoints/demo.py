"""`openft demo` / `make demo`: the whole product on the embedded defaults, driven by the OpenAI SDK.

Starts a local Ray with the API on Ray Serve and the job controller, creates an account, uploads
the built-in ticket-classification dataset, fine-tunes the qwen2.5-0.5b-instruct stand-in with
LoRA, follows the job's events, then downloads the adapter, loads it with peft and answers
held-out tickets (never trained on) next to the untrained base.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from openft.settings import Settings
from storage.keys import ADAPTER_FILES

BASE = "qwen2.5-0.5b-instruct"


def _answer(model, tokenizer, ticket: str) -> str:
    """What the model generated after the ticket, as it generated it (whitespace kept)."""
    import torch

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def _label(answer: str) -> str:
    """The answer's first word, the label the model chose."""
    return (answer.strip().split() or [""])[0]


def _shown(answer: str, width: int) -> str:
    """The answer for the table: its label, or, when it has no word at all (an untrained base
    answers newlines), the raw text with its whitespace escaped, so the column says what it said."""
    text = _label(answer) or repr(answer)
    return text if len(text) <= width else text[: width - 1] + "…"


def _follow(client, job_id: str) -> object:
    """Print the job's events; a progress bar from the first metrics event on, when the total of
    steps is known (a bar made before it would start at 0/1 and then jump)."""
    from tqdm import tqdm

    seen: set[str] = set()
    bar = None
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        events = list(client.fine_tuning.jobs.list_events(job_id, limit=100))
        for event in reversed(events):
            if event.id in seen:
                continue
            seen.add(event.id)
            data = event.data or {}
            if event.type == "metrics" and "total_steps" in data:
                if bar is None:
                    bar = tqdm(total=data["total_steps"], desc="training", unit="step", dynamic_ncols=True)
                bar.update(data["step"] - bar.n)
                bar.set_postfix(loss=f"{data.get('train_loss', float('nan')):.3f}", refresh=True)
            else:
                tqdm.write(f"[{event.level}] {event.message}")
        if job.status in ("succeeded", "failed", "cancelled"):
            if bar is not None:
                bar.close()
            return job
        time.sleep(1.0)


def run_demo(settings: Settings, *, host: str, port: int) -> int:
    from entrypoints.ray_runtime import prepare_ray_environment

    prepare_ray_environment(settings)
    from entrypoints import third_party_noise

    third_party_noise.quiet_demo()
    from entrypoints.ray_runtime import deploy_api, start_ray
    from worker.controller import start_controller

    import ray

    context = start_ray(settings, num_cpus=None)
    try:
        base_url = deploy_api(settings, host=host, port=port)
        controller = start_controller(settings)  # held: the actor lives as long as a handle does
        print(f"openft API: {base_url}")
        if getattr(context, "dashboard_url", None):
            print(f"Ray dashboard: http://{context.dashboard_url} (token in {settings.data_dir / 'ray_auth_token'})")
        return _demo(settings, base_url)
    finally:
        # No request is in flight here, so no grace to give: ray.shutdown() stops the whole local
        # cluster. serve.shutdown() first would kill Serve's controller while its graceful_shutdown
        # call is being retried, and Ray prints that retry's failure ("graceful_shutdown failed").
        ray.shutdown()


def _demo(settings: Settings, base_url: str) -> int:
    import openai

    from storage.accounts import create_account
    from storage.db import Database

    db = Database(settings.resolved_database_url())
    with db.session() as session:
        _, key = create_account(session, f"demo-{uuid.uuid4().hex[:6]}", open_jobs_limit=3)
    client = openai.OpenAI(base_url=base_url, api_key=key)

    train_rows, held_out = ticket_splits()
    upload = client.files.create(file=("tickets.jsonl", io.BytesIO(tickets_jsonl(train_rows))), purpose="fine-tune")
    print(f"uploaded {upload.id}: {upload.model_extra['gridline']['rows']} rows")
    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=upload.id,
        method={"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {
            "n_epochs": 5, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 16, "lora_alpha": 32}}},
        seed=0,
    )
    quote = job.model_extra["gridline"]["quote"]
    print(f"job {job.id}: {job.status}; quote {quote['estimated_seconds']} s, max charge ${quote['per_token']['max_charge_usd']}")
    job = _follow(client, job.id)
    if job.status != "succeeded":
        print(f"job ended {job.status}: {job.error}")
        return 1
    result = job.model_extra["gridline"]["result"]
    print(f"eval loss before {result['eval_loss_before']:.4f} -> after {result['eval_loss']:.4f} on {result['eval_rows']} rows")
    adapter = job.model_extra["gridline"]["fine_tuned_adapter"]["model"]
    return _compare(client, settings, adapter, held_out)


def _compare(client, settings: Settings, model_name: str, held_out: list[tuple[str, str]]) -> int:
    with tempfile.TemporaryDirectory(prefix="openft-adapter-") as tmp:
        return _compare_with(client, settings, model_name, held_out, Path(tmp))


def _compare_with(client, settings: Settings, model_name: str, held_out: list[tuple[str, str]], adapter_dir: Path) -> int:
    from catalog.bases import get_base
    from catalog.model_source import import_peft, load_model, load_tokenizer, parse_model_source

    PeftModel = import_peft().PeftModel  # noqa: N806 (the class)

    for name in ADAPTER_FILES:
        response = httpx.get(f"{client.base_url}gridline/adapters/{model_name}/files/{name}",
                             headers={"Authorization": f"Bearer {client.api_key}"})
        response.raise_for_status()
        assert response.headers["x-gridline-sha256"] == hashlib.sha256(response.content).hexdigest()
        (adapter_dir / name).write_bytes(response.content)
    print(f"downloaded the adapter of {model_name} to {adapter_dir} (SHA-256 checked; removed when the demo ends)")
    base = get_base(BASE)
    source = parse_model_source(settings.model_source)
    tokenizer = load_tokenizer(base, source, settings.model_cache_dir)
    plain = load_model(base, source, settings.model_cache_dir).eval()
    tuned = PeftModel.from_pretrained(load_model(base, source, settings.model_cache_dir), adapter_dir).eval()
    right = {"base": 0, "tuned": 0}
    print(f"\n{'held-out ticket':<58} {'label':<9} {'base answered':<16} fine-tuned answered")
    for ticket, label in held_out:
        a, b = _answer(plain, tokenizer, ticket), _answer(tuned, tokenizer, ticket)
        right["base"] += _label(a) == label
        right["tuned"] += _label(b) == label
        print(f"{ticket[:56]:<58} {label:<9} {_shown(a, 15):<16} {_shown(b, 20)}")
    n = len(held_out)
    print(f"\naccuracy on {n} held-out tickets: base {right['base']}/{n}, fine-tuned {right['tuned']}/{n}")
    return 0
