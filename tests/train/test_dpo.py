"""The DPO recipe on the qwen2.5-0.5b stand-in: eval loss is exactly ln 2 before training (the
adapter starts as the identity, the reference is the same model with it disabled) and falls."""

from __future__ import annotations

import dataclasses
import json
import math

from openft.demo_data import SYSTEM, ticket_splits
from tests.train.conftest import make_job, tokenize
from train.data import split_holdout
from train.dpo import train_dpo
from train.progress import FileReporter

REJECTED = "i do not know"  # an answer the job prefers less than every label


def preference_jsonl(rows: list[tuple[str, str]]) -> bytes:
    lines = [
        json.dumps({
            "input": {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}]},
            "preferred_output": [{"role": "assistant", "content": label}],
            "non_preferred_output": [{"role": "assistant", "content": REJECTED}],
        })
        for ticket, label in rows
    ]
    return ("\n".join(lines) + "\n").encode()


def test_dpo_eval_loss_starts_at_ln2_and_falls(store, cache_root, base, tokenizer, tmp_path):
    file_rows = ticket_splits()[0][:120]
    rows, report = tokenize(preference_jsonl(file_rows), tokenizer, base, method="dpo")
    assert (report["rows"], report["rows_used"], report["pairs_ending_with_eot"]) == (120, 120, 120)
    assert report["tokens"] == sum(len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows)
    train_rows, eval_rows = split_holdout(rows, len(file_rows), seed=0)
    job = make_job(store, cache_root, method_type="dpo", beta=0.5, n_epochs=2, batch_size=8, learning_rate=5e-3)
    reporter = FileReporter(tmp_path / "log.jsonl")

    outcome = train_dpo(job, reporter, train_rows, eval_rows)

    assert outcome.status == "succeeded"
    result = outcome.result
    assert math.isclose(result["eval_loss_before"], math.log(2), abs_tol=1e-12)
    assert result["eval_loss"] < 0.6 and result["train_loss"] < math.log(2)
    assert result["eval_rows"] == len(eval_rows) == 6
    answers = sum(len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in train_rows)
    assert result["trained_tokens"] == 2 * answers

    # A resumed run reuses the reference log-probs from the checkpoint (they are not recomputed).
    resumed = train_dpo(dataclasses.replace(job, resume=True, output_prefix="adapters/resumed/"), reporter, train_rows, eval_rows)
    assert resumed.result["steps"] == result["steps"] and resumed.result["eval_loss"] == result["eval_loss"]
    assert store.get_bytes("adapters/resumed/adapter_model.safetensors") == store.get_bytes(job.output_prefix + "adapter_model.safetensors")


def test_dpo_from_a_parent_adapter_starts_at_ln2_against_the_parent(store, cache_root, base, tokenizer, tmp_path):
    """A job that continues from an ft: model (jobs/lineage.py): the adapter starts as the parent's
    (a random, non-zero one here) and the reference is the parent, so the loss starts at ln 2 again;
    against the base it would not."""
    from tests.factories import random_adapter

    for name, data in random_adapter(base, cache_root, seed=3, rank=8).items():
        store.put_bytes("parents/p/" + name, data)
    rows, _ = tokenize(preference_jsonl(ticket_splits()[0][:24]), tokenizer, base, method="dpo")
    train_rows, eval_rows = rows[:20], rows[20:]
    job = make_job(store, cache_root, method_type="dpo", beta=0.5, n_epochs=1, batch_size=4, learning_rate=5e-3,
                   lora_rank=8, lora_alpha=16, init_adapter_prefix="parents/p/")
    outcome = train_dpo(job, FileReporter(tmp_path / "log.jsonl"), train_rows, eval_rows)
    assert outcome.status == "succeeded"
    assert math.isclose(outcome.result["eval_loss_before"], math.log(2), abs_tol=1e-9)
    assert outcome.result["eval_loss"] < math.log(2)
    fresh = train_dpo(dataclasses.replace(job, init_adapter_prefix=None, output_prefix="adapters/fresh/"),
                      FileReporter(tmp_path / "fresh.jsonl"), train_rows, eval_rows)
    assert fresh.result["train_loss"] != outcome.result["train_loss"]  # it did start elsewhere
