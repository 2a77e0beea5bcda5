"""The reinforcement recipe (train/rft.py) on the qwen2.5-0.5b stand-in, started from a short SFT
adapter of the ticket task (the stand-in untrained never says a label): its metrics, the validation
reward on the checkpoints and in the result, seeded sampling (same seed, same adapter bytes; a
paused and resumed run ends with the uninterrupted run's bytes), the KL to the parent, and a grader
that fails on every sample failing the job."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from openft.demo_data import SYSTEM, ticket_splits
from openft.errors import TrainingError
from storage.objects import open_object_store
from tests.train.conftest import make_job, tokenize
from train.progress import FileReporter
from train.rft import example_settings, train_rft
from train.sft import train_sft

PARENT = "adapters/parent/"


def prompts_jsonl(pairs) -> bytes:
    return b"".join(orjson.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                  "answer": label}) + b"\n" for t, label in pairs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module: its tests start from the same parent adapter, trained once."""
    return open_object_store(f"file://{tmp_path_factory.mktemp('rft') / 'objects'}")


@pytest.fixture(scope="module")
def parent(store, cache_root, ticket_rows, tmp_path_factory):
    """A short SFT adapter: the labels are among the stand-in's likeliest first tokens."""
    job = make_job(store, cache_root, n_epochs=3, output_prefix=PARENT, checkpoint_prefix="ck/parent/")
    log = FileReporter(tmp_path_factory.mktemp("sft") / "sft.jsonl")
    assert train_sft(job, log, ticket_rows[:160], ticket_rows[160:164]).status == "succeeded"
    return PARENT


@pytest.fixture
def prompts(tokenizer, base):
    train, report = tokenize(prompts_jsonl(ticket_splits()[0][:8]), tokenizer, base, method="reinforcement")
    assert (report["rows"], report["rows_used"]) == (8, 8)
    assert report["prompt_tokens"] == report["tokens"] == sum(len(r["prompt_ids"]) for r in train)
    assert [orjson.loads(r["item"])["answer"] for r in train] == [label for _, label in ticket_splits()[0][:8]]
    evals, _ = tokenize(prompts_jsonl(ticket_splits()[1][:4]), tokenizer, base, method="reinforcement")
    return train, evals


def rft_job(store, cache_root, parent, name: str, **settings):
    return make_job(store, cache_root, method_type="reinforcement", beta=0.04, n_epochs=2, batch_size=4,
                    learning_rate=1e-3, init_adapter_prefix=parent, eval_source="validation_file", eval_prefix="v/",
                    output_prefix=f"adapters/{name}/", checkpoint_prefix=f"ck/{name}/",
                    reinforcement=example_settings(**{"samples_per_prompt": 4, "eval_interval": 1,
                                                      "max_completion_tokens": 3, "temperature": 0.2, **settings}))


def test_rft_reports_rewards_and_is_seeded(store, cache_root, parent, prompts, tmp_path):
    train, evals = prompts
    job = rft_job(store, cache_root, parent, "plain")
    log = FileReporter(tmp_path / "plain.jsonl")
    outcome = train_rft(job, log, train, evals)
    assert outcome.status == "succeeded", outcome.error
    result = outcome.result
    assert 0 <= result["eval_reward_before"] <= 1 and 0 <= result["eval_reward"] <= 1
    assert (result["steps"], result["eval_rows"], result["eval_source"]) == (4, 4, "validation_file")
    metrics = [r["data"] for r in log.records() if r["type"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # one event per step
    for m in metrics:
        assert 0 <= m["reward_mean"] <= 1 and m["reward_std"] >= 0 and m["kl"] >= 0
        assert 1 <= m["completion_length"] <= 3 and 0 <= m["zero_variance_groups"] <= 1
        assert m["grader_failures"] == 0 and m["completions_per_second"] > 0
    assert metrics[0]["kl"] == pytest.approx(0, abs=1e-6)  # the first samples come from the parent itself
    # Every eval_interval (1) steps the validation reward is measured and kept on that step's checkpoint.
    saved = [r["data"]["checkpoint"] for r in log.records() if r["type"] == "event" and "checkpoint" in (r["data"] or {})
             and isinstance(r["data"]["checkpoint"], dict)]
    assert [c["step"] for c in saved] == [1, 2, 3, 4]
    assert all(0 <= c["valid_reward"] <= 1 for c in saved)
    assert saved[-1]["valid_reward"] == result["eval_reward"]  # nothing trains between the last two
    # 4 prompts x 4 samples a step: each sequence's prompt and completion tokens.
    prompt_tokens = sum(len(r["prompt_ids"]) for r in train)
    completions = sum(m["completion_length"] * 16 for m in metrics)
    assert result["trained_tokens"] == pytest.approx(2 * 4 * prompt_tokens + completions)

    again = train_rft(dataclasses.replace(job, output_prefix="adapters/again/", checkpoint_prefix="ck/again/"),
                      FileReporter(tmp_path / "again.jsonl"), train, evals)
    assert store.get_bytes("adapters/again/adapter_model.safetensors") == store.get_bytes(
        job.output_prefix + "adapter_model.safetensors")
    assert {k: v for k, v in again.result.items() if k != "seconds"} == {
        k: v for k, v in result.items() if k != "seconds"}


@pytest.mark.heavy  # three more runs: make test-heavy
def test_a_paused_rft_run_resumes_to_the_same_adapter(store, cache_root, parent, prompts, tmp_path):
    train, evals = prompts
    plain = rft_job(store, cache_root, parent, "plain-10", eval_interval=10)
    paused = dataclasses.replace(plain, output_prefix="adapters/paused/", checkpoint_prefix="ck/paused/")

    class PauseAt(FileReporter):
        def __init__(self, at: int):
            super().__init__(tmp_path / "paused.jsonl")
            self.polls, self.at = 0, at

        def control(self):
            self.polls += 1
            return "pause" if self.polls == self.at else None

    train_rft(plain, FileReporter(tmp_path / "plain.jsonl"), train, evals)
    assert train_rft(paused, PauseAt(2), train, evals).status == "paused"
    resumed = train_rft(dataclasses.replace(paused, resume=True), PauseAt(0), train, evals)
    assert resumed.status == "succeeded"
    assert store.get_bytes("adapters/paused/adapter_model.safetensors") == store.get_bytes(
        plain.output_prefix + "adapter_model.safetensors")


def test_a_grader_that_fails_on_every_sample_fails_the_job(store, cache_root, parent, prompts, tmp_path):
    train, evals = prompts
    broken = {"type": "python", "name": "broken", "source": "def grade(sample, item):\n    raise ValueError('no')\n"}
    job = dataclasses.replace(rft_job(store, cache_root, parent, "broken"), n_epochs=1, batch_size=2,
                              reinforcement=example_settings(grader=broken, samples_per_prompt=2, max_completion_tokens=2,
                                                             temperature=0.2))
    with pytest.raises(TrainingError) as failed:
        train_rft(job, FileReporter(tmp_path / "broken.jsonl"), train[:2], evals[:1])
    assert failed.value.code == "grader_failed" and "4 samples" in failed.value.message


def test_reasoning_effort_turns_the_thinking_switch_on_and_grades_the_answer_after_it(store, cache_root, tmp_path):
    """qwen3-8b's template: the tokenizer stage renders prompts with thinking off (its empty think
    block); reasoning_effort medium renders them with it on, and the grader reads what follows </think>."""
    import torch

    from catalog.bases import get_base
    from catalog.model_source import ModelSource, load_tokenizer
    from jobs.reinforcement import enable_thinking
    from train.lora import build_model
    from train.parallel import SINGLE
    from train.rft import RFTSteps

    base = get_base("qwen3-8b")
    assert (enable_thinking("medium", base), enable_thinking("low", base), enable_thinking("default", base)) == (
        True, False, None)
    tokenizer = load_tokenizer(base, ModelSource("standin"), cache_root)
    rows, _ = tokenize(prompts_jsonl(ticket_splits()[0][:2]), tokenizer, base, method="reinforcement")
    off = [list(r["prompt_ids"]) for r in rows]
    job = make_job(store, cache_root, base_id="qwen3-8b", method_type="reinforcement", beta=0.0, batch_size=2,
                   reinforcement=example_settings(enable_thinking=True))
    steps = RFTSteps(job, build_model(job, base, torch.device("cpu")), torch.device("cpu"), 0, rows, [], SINGLE)
    on = tokenizer.decode(steps.train_rows[0]["prompt_ids"])
    assert steps.train_rows[0]["prompt_ids"] != off[0] and "<think>" in tokenizer.decode(off[0]) and "<think>" not in on
    assert on.endswith("<|im_start|>assistant\n")
    assert steps._graded_text("<think>\nit is about a parcel\n</think>\n\ndelivery") == "delivery"


def test_a_grade_counts_as_failed_when_its_grader_gave_no_score():
    from graders import Grade
    from train.rft import _failed

    assert _failed(Grade(0.0, False, {"errors": {"python_grader_runtime_error": True}}))
    assert not _failed(Grade(0.0, False, {}))  # a wrong answer is a grade of 0, not a failure
    # A multi grade whose judge failed but whose formula still scored: a grade, the judge's 0 in it.
    assert not _failed(Grade(0.5, True, {"errors": {"model_grader_parse_error": True}, "sub_scores": {"a": 1, "b": 0}}))
