"""The SFT recipe on the qwen2.5-0.5b stand-in: it learns the ticket task, weight-0 turns do not
train, the adapter files are peft's, and a run is a pure function of its seed and data."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load as load_safetensors

from catalog.model_source import ModelSource, load_model
from openft.demo_data import SYSTEM, ticket_splits
from openft.errors import TrainingError
from tests.train.conftest import classify, make_job, tokenize
from train.data import split_holdout
from train.progress import FileReporter
from train.sft import RESULT_KEYS, train_sft


def _load_adapter(store, job, base, cache_root):
    config = json.loads(store.get_bytes(job.output_prefix + "adapter_config.json"))
    model = load_model(base, ModelSource("standin"), cache_root)
    lora = LoraConfig(r=config["r"], lora_alpha=config["lora_alpha"], target_modules=config["target_modules"])
    peft_model = get_peft_model(model, lora)
    set_peft_model_state_dict(peft_model, load_safetensors(store.get_bytes(job.output_prefix + "adapter_model.safetensors")))
    return peft_model.eval(), config


def test_sft_learns_the_ticket_task(store, cache_root, base, tokenizer, ticket_rows, tmp_path):
    file_rows = len(ticket_splits()[0])
    train_rows, eval_rows = split_holdout(ticket_rows, file_rows, seed=0)
    assert len(eval_rows) == file_rows // 20 and not {r["line"] for r in eval_rows} & {r["line"] for r in train_rows}
    job = make_job(store, cache_root)
    reporter = FileReporter(tmp_path / "log.jsonl")

    outcome = train_sft(job, reporter, train_rows, eval_rows)

    assert outcome.status == "succeeded" and outcome.error is None
    result = outcome.result
    assert tuple(result) == RESULT_KEYS
    assert result["eval_loss"] < result["eval_loss_before"] - 1.0
    assert (result["eval_rows"], result["eval_source"]) == (len(eval_rows), "holdout")
    assert result["steps"] == job.n_epochs * -(-len(train_rows) // job.batch_size)
    assert result["trained_tokens"] == job.n_epochs * sum(len(r["input_ids"]) for r in train_rows)
    metrics = [r["data"] for r in reporter.records() if r["type"] == "metrics"]
    assert metrics[-1]["step"] == result["steps"] == metrics[-1]["total_steps"]
    assert set(metrics[0]) == {"step", "train_loss", "learning_rate", "tokens_per_second", "elapsed", "total_steps"}

    # Every epoch checkpointed; the 3 newest adapters are kept in peft's files (each is a model), with
    # their digests in meta.json, and the optimizer state of the newest only. The last one is the adapter.
    kept = sorted({k.rsplit("/", 2)[1] for k in store.list(job.checkpoint_prefix)})
    epoch_steps = result["steps"] // job.n_epochs
    assert kept == [f"step-{epoch_steps * e:08d}" for e in (3, 4, 5)]
    for folder in kept:
        key = f"{job.checkpoint_prefix}{folder}/"
        meta = json.loads(store.get_bytes(key + "meta.json"))
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            data = store.get_bytes(key + name)
            assert meta["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        assert store.exists(key + "state.pt") == (folder == kept[-1])
    last = f"{job.checkpoint_prefix}{kept[-1]}/"
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert store.get_bytes(last + name) == store.get_bytes(job.output_prefix + name)

    model, config = _load_adapter(store, job, base, cache_root)
    assert (config["base_model_name_or_path"], config["revision"]) == (base.id, base.revision)
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (16, 32, "LORA")
    held_out = ticket_splits()[1]
    correct = sum(classify(model, tokenizer, ticket) == label for ticket, label in held_out)
    with model.disable_adapter():
        untrained = sum(classify(model, tokenizer, ticket) == label for ticket, label in held_out)
    assert correct >= 0.9 * len(held_out)
    assert untrained <= 0.1 * len(held_out)


def _rows_ending_with(final: str, weight: int) -> bytes:
    """Ticket -> label (trains), then a follow-up whose answer is `final` with `weight`."""
    lines = []
    for ticket, label in ticket_splits()[0][:32]:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ticket},
            {"role": "assistant", "content": label},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": final, "weight": weight},
        ]
        lines.append(json.dumps({"messages": messages}).encode())
    return b"\n".join(lines) + b"\n"


def test_weight_zero_turns_do_not_train(store, cache_root, base, tokenizer):
    # Two files that differ only in a last, weight-0 answer of the same token count: with its tokens
    # masked (and causal attention), the runs must end with the same adapter bytes. With weight 1
    # the same difference changes the adapter.
    assert len(tokenizer.tokenize("refund")) == len(tokenizer.tokenize("delivery"))
    adapters = {}
    for final in ("refund", "delivery"):
        for weight in (0, 1):
            rows, report = tokenize(_rows_ending_with(final, weight), tokenizer, base)
            assert report["context_tokens"]["assistant"] == (32 * 3 if weight == 0 else 0)  # "re", "fund", <|im_end|>
            prefix = f"adapters/{final}-{weight}/"
            job = make_job(store, cache_root, n_epochs=1, output_prefix=prefix, checkpoint_prefix=f"ck/{final}-{weight}/")
            outcome = train_sft(job, FileReporter(store.root / "log.jsonl"), rows, [])
            assert (outcome.result["eval_loss_before"], outcome.result["eval_loss"], outcome.result["eval_rows"]) == (None, None, 0)
            adapters[final, weight] = store.get_bytes(prefix + "adapter_model.safetensors")
    assert adapters["refund", 0] == adapters["delivery", 0]
    assert adapters["refund", 1] != adapters["delivery", 1]


def test_same_seed_same_adapter_bytes_and_pause_resume(store, cache_root, ticket_rows, tmp_path):
    rows = ticket_rows[:48]
    train_rows, eval_rows = rows[:40], rows[40:]
    plain = make_job(store, cache_root, n_epochs=2, output_prefix="a/plain/", checkpoint_prefix="ck/plain/")
    again = dataclasses.replace(plain, output_prefix="a/again/", checkpoint_prefix="ck/again/")
    paused = dataclasses.replace(plain, output_prefix="a/paused/", checkpoint_prefix="ck/paused/")

    class PauseAt:
        """Asks for a pause at its `at`-th poll (mid first epoch), then never again."""

        def __init__(self, at: int):
            self.polls, self.at, self.log = 0, at, FileReporter(tmp_path / "paused.jsonl")

        def metrics(self, data):
            self.log.metrics(data)

        def event(self, message, *, level="info", data=None):
            self.log.event(message, level=level, data=data)

        def control(self):
            self.polls += 1
            return "pause" if self.polls == self.at else None

    first = train_sft(plain, FileReporter(tmp_path / "plain.jsonl"), train_rows, eval_rows)
    second = train_sft(again, FileReporter(tmp_path / "again.jsonl"), train_rows, eval_rows)
    stopped = train_sft(paused, PauseAt(4), train_rows, eval_rows)
    assert stopped.status == "paused" and not store.exists(paused.output_prefix + "adapter_model.safetensors")
    assert [k.rsplit("/", 1)[1] for k in store.list(paused.checkpoint_prefix)] == [
        "adapter_config.json", "adapter_model.safetensors", "meta.json", "state.pt"]
    resumed = train_sft(dataclasses.replace(paused, resume=True), PauseAt(0), train_rows, eval_rows)

    weights = [store.get_bytes(j.output_prefix + "adapter_model.safetensors") for j in (plain, again, paused)]
    assert weights[0] == weights[1] == weights[2]
    for outcome in (second, resumed):
        assert {k: v for k, v in outcome.result.items() if k != "seconds"} == {
            k: v for k, v in first.result.items() if k != "seconds"
        }
    records = PauseAt(0).log.records()
    messages = [r["message"] for r in records if r["type"] == "event"]
    assert "Training paused at step 3; checkpoint saved." in messages
    # The resumed run says where it starts before its metrics step back to it.
    at = next(i for i, r in enumerate(records) if r.get("message") == "Resumed from the checkpoint at step 3.")
    assert (records[at]["level"], records[at]["data"]) == ("info", {"step": 3, "epoch": 0, "checkpoint": "ckpt-step-3"})
    assert next(r["data"]["step"] for r in records[at:] if r["type"] == "metrics") > 3


def test_cancel_stops_without_adapter(store, cache_root, ticket_rows, tmp_path):
    control = tmp_path / "control"
    control.write_text("cancel")
    job = make_job(store, cache_root, n_epochs=1)
    outcome = train_sft(job, FileReporter(tmp_path / "log.jsonl", control), ticket_rows[:16], ticket_rows[16:20])
    assert (outcome.status, outcome.result) == ("cancelled", None)
    assert list(store.list(job.output_prefix)) == [] and list(store.list(job.checkpoint_prefix)) == []


def test_qlora_trains_on_cpu(store, cache_root, ticket_rows, tmp_path):
    job = make_job(store, cache_root, adapter="qlora", n_epochs=1)
    outcome = train_sft(job, FileReporter(tmp_path / "log.jsonl"), ticket_rows[:64], ticket_rows[64:72])
    assert outcome.status == "succeeded"
    assert outcome.result["eval_loss"] < outcome.result["eval_loss_before"]
    weights = load_safetensors(store.get_bytes(job.output_prefix + "adapter_model.safetensors"))
    assert any(k.endswith("q_proj.lora_B.weight") for k in weights) and all(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k)


def test_time_limit_is_a_training_error(store, cache_root, ticket_rows, tmp_path):
    job = make_job(store, cache_root, time_limit_s=0.0)
    with pytest.raises(TrainingError) as info:
        train_sft(job, FileReporter(tmp_path / "log.jsonl"), ticket_rows[:8], [])
    assert info.value.code == "time_limit_exceeded"
    assert list(store.list(job.output_prefix)) == []
