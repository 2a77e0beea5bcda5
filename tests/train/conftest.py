"""Shared pieces of the training tests: the qwen2.5-0.5b stand-in, the ticket task tokenized, a
local object store, and a TrainJob builder with settings that learn the ticket task in seconds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from catalog.bases import get_base
from catalog.model_source import ModelSource, load_tokenizer
from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from pipelines.tokenize import tokenize_lines
from storage.objects import open_object_store
from train.config import TrainJob

BASE_ID = "qwen2.5-0.5b-instruct"
MAX_SEQ = 256


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    # The suite shares two cores with other processes: one thread per process is faster and keeps
    # CPU results bit-for-bit reproducible.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "model-cache"  # shared with tests/catalog and tests/pipelines


@pytest.fixture(scope="session")
def base():
    return get_base(BASE_ID)


@pytest.fixture(scope="session")
def tokenizer(base, cache_root):
    return load_tokenizer(base, ModelSource("standin"), cache_root)


def tokenize(jsonl: bytes, tokenizer, base, method: str = "supervised", max_seq_length: int = MAX_SEQ) -> tuple[list[dict], dict]:
    table, report = tokenize_lines(jsonl.splitlines(), 1, tokenizer, base, max_seq_length, method)
    return table.to_pylist(), report


@pytest.fixture(scope="session")
def ticket_rows(tokenizer, base) -> list[dict]:
    rows, _ = tokenize(tickets_jsonl(ticket_splits()[0]), tokenizer, base)
    return rows


@pytest.fixture
def store(tmp_path):
    return open_object_store(f"file://{tmp_path / 'objects'}")


def make_job(store, cache_root: Path, **overrides) -> TrainJob:
    fields = dict(
        job_id="ftjob-test",
        run_name="ftjob-test-1",
        base_id=BASE_ID,
        method_type="supervised",
        adapter="lora",
        n_epochs=5,
        batch_size=4,
        learning_rate=3e-3,
        lora_rank=16,
        lora_alpha=32,
        max_seq_length=MAX_SEQ,
        beta=None,
        seed=0,
        model_source="standin",
        cache_root=str(cache_root),
        store_spec=store.spec(),
        train_prefix="tokenized/train/",
        eval_prefix=None,
        eval_source="holdout",
        output_prefix="adapters/ftjob-test/",
        checkpoint_prefix="checkpoints/ftjob-test/",
        resume=False,
    )
    return dataclasses.replace(TrainJob(**fields), **overrides) if overrides else TrainJob(**fields)


def classify(model, tokenizer, ticket: str) -> str:
    """Greedy-decode the model's answer to one ticket, as the service's batches would prompt it."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0][len(ids) :], skip_special_tokens=True).strip()
