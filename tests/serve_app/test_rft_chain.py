"""Chains of jobs through the official SDK with the real job controller (issue 26): a job that
continues from an ft: model starts from its weights; SFT, DPO and RFT run as three jobs, each on
the one before; SFT then reinforcement fine-tuning on the
ticket task raises the validation reward, the child answers the held-out tickets better than its
parent in an eval run and in the batch API, and its results file has the reward by step (make
test-heavy)."""

from __future__ import annotations

import csv
import io
import math

import orjson
import pytest

from openft.demo_data import SYSTEM, ticket_splits, tickets_jsonl
from tests.factories import batch_request_line, preference_row
from tests.serve_app.test_batches_e2e import file_lines, run_batch_file
from tests.serve_app.test_eval_runs_api import wait_run
from tests.serve_app.test_training_api import wait

BASE = "qwen2.5-0.5b-instruct"
SHORT_SFT = {"type": "supervised", "supervised": {"hyperparameters": {
    "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 8, "lora_alpha": 16}}}


@pytest.fixture(scope="module")
def chain_account(training_api, controller):
    _, key = training_api.create_account(open_jobs=3)
    return training_api.client(key)


@pytest.mark.heavy  # two training runs through the controller (about a minute): make test-heavy
def test_an_sft_job_on_an_sft_model_starts_from_its_weights(chain_account):
    """Both jobs hold out the same rows (same file, same seed), so the child's eval loss before
    training is the parent's eval loss after it: the child's first forward is the parent's model."""
    client = chain_account
    rows = ticket_splits()[0][:40]
    upload = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(rows))), purpose="fine-tune")
    parent = wait(client, client.fine_tuning.jobs.create(model=BASE, training_file=upload.id, method=SHORT_SFT,
                                                         seed=5).id)
    assert parent.status == "succeeded", parent.error
    child = client.fine_tuning.jobs.create(model=parent.fine_tuned_model, training_file=upload.id, seed=5,
                                           method={"type": "supervised", "supervised": {"hyperparameters": {
                                               "n_epochs": 1, "batch_size": 4, "learning_rate": 3e-3}}})
    assert child.model_extra["gridline"]["parent"]["fine_tuning_job_id"] == parent.id
    child = wait(client, child.id)
    assert child.status == "succeeded", child.error
    before, after = parent.model_extra["gridline"]["result"], child.model_extra["gridline"]["result"]
    assert after["eval_loss_before"] == pytest.approx(before["eval_loss"], rel=1e-5)
    assert not math.isclose(after["eval_loss_before"], before["eval_loss_before"], rel_tol=1e-3)
    assert child.fine_tuned_model != parent.fine_tuned_model


@pytest.mark.heavy  # three small training runs through the controller: make test-heavy
def test_sft_then_dpo_then_rft_as_three_jobs(chain_account):
    """The usual chain as three SDK calls, each job continuing from the one before: SFT on the
    tickets; DPO on it (the right label preferred to a wrong one), whose reference is its parent, so
    its first forward is the parent's (eval loss ln 2 before training); RFT on the DPO model, whose
    validation reward before training comes from that model's answers: the base (adapter off) gets
    no label right on these tickets, the chain's model does."""
    client = chain_account
    rows, held = ticket_splits()
    labels = sorted({label for _, label in rows})
    sft_file = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(rows[:160]))), purpose="fine-tune")
    sft = wait(client, client.fine_tuning.jobs.create(model=BASE, training_file=sft_file.id, seed=1, method={
        "type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 2, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 8, "lora_alpha": 16}}}).id, timeout=900)
    assert sft.status == "succeeded", sft.error

    # Preferences: the ticket's label over the next label in the list (a wrong one).
    prefs = [preference_row(t, label, labels[(labels.index(label) + 1) % len(labels)], system=SYSTEM) for t, label in rows[:60]]
    dpo_file = client.files.create(file=("p.jsonl", io.BytesIO(b"".join(orjson.dumps(r) + b"\n" for r in prefs))),
                                   purpose="fine-tune")
    dpo = client.fine_tuning.jobs.create(model=sft.fine_tuned_model, training_file=dpo_file.id, seed=1, method={
        "type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1, "n_epochs": 1, "batch_size": 4, "learning_rate": 1e-3}}})
    assert dpo.model_extra["gridline"]["parent"]["fine_tuning_job_id"] == sft.id
    dpo = wait(client, dpo.id, timeout=900)
    assert dpo.status == "succeeded", dpo.error
    assert dpo.model_extra["gridline"]["result"]["eval_loss_before"] == pytest.approx(math.log(2), abs=1e-3)

    prompts = client.files.create(file=("r.jsonl", io.BytesIO(prompts_jsonl(rows[:16]))), purpose="fine-tune")
    held_prompts = client.files.create(file=("h.jsonl", io.BytesIO(prompts_jsonl(held[:20]))), purpose="fine-tune")
    rft = client.fine_tuning.jobs.create(model=dpo.fine_tuned_model, training_file=prompts.id, validation_file=held_prompts.id,
                                         seed=1, method={"type": "reinforcement", "reinforcement": {"grader": EXACT,
                                         "hyperparameters": {"batch_size": 8, "n_epochs": 1, "compute_multiplier": 0.5,
                                                             "eval_samples": 1, "temperature": 0.2, "max_completion_tokens": 4}}})  # fmt: skip
    parent = rft.model_extra["gridline"]["parent"]
    assert (parent["model"], parent["fine_tuning_job_id"]) == (dpo.fine_tuned_model, dpo.id)
    rft = wait(client, rft.id, timeout=900)
    assert rft.status == "succeeded", rft.error
    result = rft.model_extra["gridline"]["result"]
    print(f"SFT -> DPO -> RFT: validation reward before {result['eval_reward_before']:.3f}, after {result['eval_reward']:.3f}")
    assert result["eval_reward_before"] > 0 and rft.fine_tuned_model not in (sft.fine_tuned_model, dpo.fine_tuned_model)


# -- SFT, then reinforcement fine-tuning on its model (issue 26's first "Done when") ----------------
EXACT = {"type": "string_check", "name": "label", "input": "{{sample.output_text}}", "reference": "{{item.label}}",
         "operation": "eq"}


def prompts_jsonl(pairs) -> bytes:
    return b"".join(orjson.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                  "label": label}) + b"\n" for t, label in pairs)


def held_out_accuracy(client, eval_id: str, model: str) -> tuple[int, int]:
    """(passed, total) of a greedy eval run of `model` on the held-out tickets."""
    items = [{"item": {"ticket": t, "label": label}} for t, label in ticket_splits()[1]]
    run = client.evals.runs.create(eval_id, data_source={
        "type": "completions", "model": model, "source": {"type": "file_content", "content": items},
        "input_messages": {"type": "template", "template": [{"role": "system", "content": SYSTEM},
                                                            {"role": "user", "content": "{{item.ticket}}"}]},
        "sampling_params": {"max_completion_tokens": 4, "temperature": 0, "seed": 0}})
    run = wait_run(client, eval_id, run.id, timeout=600)
    assert run.status == "completed", run.error
    return run.result_counts.passed, run.result_counts.total


@pytest.mark.heavy  # two trainings and two eval runs: minutes on two cores (make test-heavy)
@pytest.mark.timeout(2400)
def test_sft_then_rft_raises_the_validation_reward(chain_account):
    client = chain_account
    held = ticket_splits()[1]
    sft_train = client.files.create(file=("t.jsonl", io.BytesIO(tickets_jsonl(ticket_splits()[0][:160]))),
                                    purpose="fine-tune")
    sft_valid = client.files.create(file=("v.jsonl", io.BytesIO(tickets_jsonl(held))), purpose="fine-tune")
    sft = wait(client, client.fine_tuning.jobs.create(
        model=BASE, training_file=sft_train.id, validation_file=sft_valid.id, seed=0,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 6, "batch_size": 4, "learning_rate": 3e-3, "lora_rank": 16, "lora_alpha": 32}}}).id, timeout=900)
    assert sft.status == "succeeded", sft.error

    prompts = client.files.create(file=("p.jsonl", io.BytesIO(prompts_jsonl(ticket_splits()[0]))), purpose="fine-tune")
    held_prompts = client.files.create(file=("h.jsonl", io.BytesIO(prompts_jsonl(held))), purpose="fine-tune")
    rft = client.fine_tuning.jobs.create(
        model=sft.fine_tuned_model, training_file=prompts.id, validation_file=held_prompts.id, seed=0,
        method={"type": "reinforcement", "reinforcement": {"grader": EXACT, "hyperparameters": {
            "batch_size": 16, "compute_multiplier": 1.0, "n_epochs": 3, "eval_interval": 9, "eval_samples": 2,
            "learning_rate": 1e-3, "temperature": 0.2, "beta": 0, "max_completion_tokens": 5}}})
    assert rft.model_extra["gridline"]["parent"]["model"] == sft.fine_tuned_model
    rft = wait(client, rft.id, timeout=1800)
    assert rft.status == "succeeded", rft.error
    result = rft.model_extra["gridline"]["result"]
    before, after = result["eval_reward_before"], result["eval_reward"]
    print(f"validation reward before {before:.4f}, after {after:.4f}")
    # Clearly: at least a third of the validation misses gone (measured 0.775 -> 0.8875, half of them).
    assert 1 - after <= (1 - before) * 2 / 3, (before, after)
    assert rft.fine_tuned_model and rft.model_extra["gridline"]["fine_tuned_adapter"]["servable"] is True

    steps = [e.data for e in client.fine_tuning.jobs.list_events(rft.id, limit=100)
             if e.type == "metrics" and "reward_mean" in (e.data or {})]
    assert len(steps) == result["steps"]  # one metrics event per step
    assert all({"reward_std", "kl", "completion_length", "zero_variance_groups"} <= set(m) for m in steps)
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(rft.id))
    # The kept three (steps 42, 36, 28): the one saved at an eval_interval step carries its reward, epoch ends do not.
    assert [c.step_number for c in checkpoints] == [42, 36, 28]
    rewards = [c.metrics.model_extra["valid_mean_reward"] for c in checkpoints]
    assert rewards[0] is None and 0 <= rewards[1] <= 1 and rewards[2] is None

    schema = {"type": "object", "properties": {"ticket": {"type": "string"}, "label": {"type": "string"}}}
    made = client.evals.create(data_source_config={"type": "custom", "item_schema": schema,
                                                   "include_sample_schema": True}, testing_criteria=[EXACT])
    parent_right, total = held_out_accuracy(client, made.id, sft.fine_tuned_model)
    child_right, _ = held_out_accuracy(client, made.id, rft.fine_tuned_model)
    print(f"held-out greedy accuracy: parent {parent_right}/{total}, reinforcement {child_right}/{total}")
    # Measured 2026-12-06: parent 31/40, child 39/40. With the parent's 4 epochs, 21/40 then 29/40: the
    # sampled groups of a weaker parent hold too few right answers to learn from. max_completion_tokens
    # 5, not 4: "login" is 4 stand-in tokens, so at 4 its end-of-turn never fit, the policy was
    # rewarded for answers cut at the budget, and the parity check registered it not servable.
    assert child_right > parent_right and child_right >= 0.8 * total

    # The same model in the batch API, greedy on the held-out tickets: as right as in the eval run.
    batch = run_batch_file(client, [batch_request_line(f"t{i}", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}],
                                                       model=rft.fine_tuned_model, max_tokens=4, temperature=0, seed=0)
                                    for i, (t, _) in enumerate(held)])  # fmt: skip
    assert (batch.status, batch.request_counts.completed) == ("completed", total), batch
    answers = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
               for line in file_lines(client, batch.output_file_id)}
    batch_right = sum(answers[f"t{i}"] == label for i, (_, label) in enumerate(held))
    print(f"held-out greedy accuracy in the batch API: {batch_right}/{total}")
    assert batch_right > parent_right and batch_right >= 0.8 * total

    # Its results file: a row per step with the reward figures, the validation reward on the step evaluated.
    table = list(csv.DictReader(io.StringIO(client.files.content(rft.result_files[0]).content.decode())))
    by_step = sorted(steps, key=lambda m: m["step"])  # the events are listed newest first
    assert [int(r["step"]) for r in table] == [m["step"] for m in by_step]
    assert all(float(r["train_mean_reward"]) == pytest.approx(m["reward_mean"]) for r, m in zip(table, by_step))
    evaluated = {int(r["step"]): float(r["valid_mean_reward"]) for r in table if r["valid_mean_reward"]}
    assert sorted(evaluated) == [9, 18, 27, 36] and evaluated[36] == pytest.approx(rewards[1])  # every eval_interval


@pytest.mark.heavy  # a reinforcement job through the service: minutes on two cores (make test-heavy)
@pytest.mark.timeout(1200)
def test_an_rft_job_with_a_python_grader_completes(chain_account):
    """The python grader runs in the graders' sandbox from the Ray Train worker; on the untrained
    stand-in a length reward still varies within groups, so the job trains and registers."""
    client = chain_account
    source = "def grade(sample, item):\n    return min(len(sample['output_text']), 8) / 8\n"
    prompts = client.files.create(file=("p.jsonl", io.BytesIO(prompts_jsonl(ticket_splits()[0][:12]))),
                                  purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=BASE, training_file=prompts.id, seed=1, method={
        "type": "reinforcement", "reinforcement": {"grader": {"type": "python", "name": "length", "source": source},
                                                   "hyperparameters": {"batch_size": 4, "compute_multiplier": 0.25,
                                                                       "max_completion_tokens": 3, "learning_rate": 1e-4}}})
    job = wait(client, job.id, timeout=1100)
    assert job.status == "succeeded", job.error
    result = job.model_extra["gridline"]["result"]
    assert result["steps"] == 3 and 0 <= result["eval_reward"] <= 1  # 11 prompts trained (1 held out), 4 a step
    steps = [e.data for e in client.fine_tuning.jobs.list_events(job.id, limit=100)
             if e.type == "metrics" and "reward_mean" in (e.data or {})]
    assert len(steps) == 3 and all(m["grader_failures"] == 0 and m["reward_mean"] > 0 for m in steps)


@pytest.mark.heavy  # a reinforcement job through the service: minutes on two cores (make test-heavy)
@pytest.mark.timeout(1200)
def test_an_rft_job_with_a_score_model_grader_run_by_its_base_completes(chain_account):
    """The judge is the job's own untrained base, answered in the Train worker with the adapter off.
    Free, it answers words (every grade would fail, and the job with grader_failed); held to a number
    in the grader's range (pipelines/answer_format.py), it grades every sample."""
    client = chain_account
    judge = {"type": "score_model", "name": "judge", "model": BASE, "range": [0, 1],
             "input": [{"role": "system", "content": "Answer with one number from 0 to 1: 1 if the answer is the label."},
                       {"role": "user", "content": "Label: {{item.label}}. Answer: {{sample.output_text}}"}],
             "sampling_params": {"max_completions_tokens": 4}}
    prompts = client.files.create(file=("p.jsonl", io.BytesIO(prompts_jsonl(ticket_splits()[0][:12]))),
                                  purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model=BASE, training_file=prompts.id, seed=1, method={
        "type": "reinforcement", "reinforcement": {"grader": judge, "hyperparameters": {
            "batch_size": 4, "compute_multiplier": 0.25, "max_completion_tokens": 3, "learning_rate": 1e-4}}})
    job = wait(client, job.id, timeout=1100)
    assert job.status == "succeeded", job.error
    result = job.model_extra["gridline"]["result"]
    assert result["steps"] == 3 and 0 <= result["eval_reward"] <= 1
    steps = [e.data for e in client.fine_tuning.jobs.list_events(job.id, limit=100)
             if e.type == "metrics" and "reward_mean" in (e.data or {})]
    assert len(steps) == 3 and all(m["grader_failures"] == 0 for m in steps), steps
