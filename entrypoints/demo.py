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

BASE = "qwen2.5-0.5b-instruct"


def _answer(model, tokenizer, ticket: str) -> str:
    import torch

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    return (text.strip().split() or [""])[0]


def _follow(client, job_id: str) -> object:
    from tqdm import tqdm

    seen: set[str] = set()
    bar = tqdm(total=1, desc="training", unit="step")
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        events = list(client.fine_tuning.jobs.list_events(job_id, limit=100))
        for event in reversed(events):
            if event.id in seen:
                continue
            seen.add(event.id)
            data = event.data or {}
            if event.type == "metrics" and "total_steps" in data:
                bar.total = data["total_steps"]
                bar.n = data["step"]
                bar.set_postfix(loss=f"{data.get('train_loss', float('nan')):.3f}")
                bar.refresh()
            else:
                tqdm.write(f"[{event.level}] {event.message}")
        if job.status in ("succeeded", "failed", "cancelled"):
            bar.close()
            return job
        time.sleep(1.0)


def run_demo(settings: Settings, *, host: str, port: int) -> int:
    from entrypoints.ray_runtime import prepare_ray_environment

    prepare_ray_environment(settings)
    from entrypoints.ray_runtime import deploy_api, start_ray, stop_serving
    from train.controller import start_controller

    context = start_ray(settings, num_cpus=None)
    try:
        base_url = deploy_api(settings, host=host, port=port)
        controller = start_controller(settings)  # held: the actor lives as long as a handle does
        print(f"openft API: {base_url}")
        if getattr(context, "dashboard_url", None):
            print(f"Ray dashboard: http://{context.dashboard_url} (token in {settings.data_dir / 'ray_auth_token'})")
        return _demo(settings, base_url)
    finally:
        stop_serving(settings)


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
    from peft import PeftModel

    from catalog.bases import get_base
    from catalog.model_source import load_model, load_tokenizer, parse_model_source

    adapter_dir = Path(tempfile.mkdtemp(prefix="openft-adapter-"))
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        response = httpx.get(f"{client.base_url}gridline/adapters/{model_name}/files/{name}",
                             headers={"Authorization": f"Bearer {client.api_key}"})
        response.raise_for_status()
        assert response.headers["x-gridline-sha256"] == hashlib.sha256(response.content).hexdigest()
        (adapter_dir / name).write_bytes(response.content)
    print(f"downloaded the adapter of {model_name} to {adapter_dir} (SHA-256 checked)")
    base = get_base(BASE)
    source = parse_model_source(settings.model_source)
    tokenizer = load_tokenizer(base, source, settings.model_cache_dir)
    plain = load_model(base, source, settings.model_cache_dir).eval()
    tuned = PeftModel.from_pretrained(load_model(base, source, settings.model_cache_dir), adapter_dir).eval()
    right = {"base": 0, "tuned": 0}
    print(f"\n{'held-out ticket':<58} {'label':<9} {'base':<10} fine-tuned")
    for ticket, label in held_out:
        a, b = _answer(plain, tokenizer, ticket), _answer(tuned, tokenizer, ticket)
        right["base"] += a == label
        right["tuned"] += b == label
        print(f"{ticket[:56]:<58} {label:<9} {a[:9]:<10} {b}")
    n = len(held_out)
    print(f"\naccuracy on {n} held-out tickets: base {right['base']}/{n}, fine-tuned {right['tuned']}/{n}")
    return 0
