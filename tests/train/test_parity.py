"""The serving-parity check (train/parity.py) on the qwen2.5-0.5b stand-in, with a real adapter
trained on the ticket task by the SFT recipe: it passes on held-out rows; a config whose
lora_alpha differs from the trained one (served and merged != trained) fails naming the check; an
adapter that never learned to stop fails the end-of-turn check; a check that cannot run is
recorded as parity_check_error through its Ray task. The agreement rule is tested on its own."""

from __future__ import annotations

import json

import pytest
import torch

from openft.demo_data import ticket_splits, tickets_jsonl
from tests.train.conftest import make_job, tokenize
from train._parity_models import Completion
from train.data import holdout_lines, split_holdout
from train.lora import adapter_files, build_model
from train.parity import ParityRequest, check_parity, compare, held_out_lines, run_parity
from train.progress import FileReporter
from train.sft import train_sft
from storage.objects import open_object_store

TRAIN_KEY = "files/acct/tickets.jsonl"
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def pstore(tmp_path_factory):
    return open_object_store(f"file://{tmp_path_factory.mktemp('parity') / 'objects'}")


@pytest.fixture(scope="module")
def trained(pstore, cache_root, tokenizer, base, tmp_path_factory) -> str:
    """The ticket task trained by the real recipe (holdout seed 0); its adapter's store prefix."""
    data = tickets_jsonl(ticket_splits()[0])
    pstore.put_bytes(TRAIN_KEY, data)
    rows, _ = tokenize(data, tokenizer, base)
    train_rows, eval_rows = split_holdout(rows, len(ticket_splits()[0]), seed=0)
    job = make_job(pstore, cache_root)
    outcome = train_sft(job, FileReporter(tmp_path_factory.mktemp("log") / "log.jsonl"), train_rows, eval_rows)
    assert outcome.status == "succeeded"
    return job.output_prefix


def request(pstore, cache_root, prefix: str, **kw) -> ParityRequest:
    fields = dict(job_id="ftjob-test", base_id="qwen2.5-0.5b-instruct", model_source="standin", cache_root=str(cache_root),
                  store_spec=pstore.spec(), adapter_prefix=prefix, lora_rank=16, lora_alpha=32, method_type="supervised",
                  max_seq_length=256, prompts_key=TRAIN_KEY, holdout_seed=0, prompts=4, max_tokens=256,
                  tolerance=TOLERANCE)
    return ParityRequest(**(fields | kw))


def copy_adapter(pstore, src: str, dst: str, **config_changes) -> str:
    config = json.loads(pstore.get_bytes(src + "adapter_config.json"))
    pstore.put_bytes(dst + "adapter_config.json", json.dumps(config | config_changes).encode())
    pstore.put_bytes(dst + "adapter_model.safetensors", pstore.get_bytes(src + "adapter_model.safetensors"))
    return dst


def test_trained_adapter_passes_on_held_out_rows(pstore, cache_root, trained):
    out = run_parity(request(pstore, cache_root, trained))

    assert (out["servable"], out["reason"]) == (True, None), out
    figures = out["parity"]
    assert (figures["passed"], figures["check"], figures["prompts"], figures["held_out_from"]) == (True, None, 4, "holdout")
    assert set(figures["prompt_lines"]) <= holdout_lines(len(ticket_splits()[0]), 0)  # never a trained row
    for path in ("served", "merged"):
        assert figures["paths"][path]["agree"] is True
        # Every completion is a label and the end-of-turn token: at least two tokens each.
        assert figures["paths"][path]["tokens_compared"] >= 2 * figures["prompts"]
    assert figures["paths"]["served"]["identical"] == 4  # fp32, same weights: the engine matches token for token
    assert figures["eot_ok"] is True and figures["eot_completions"] == figures["completions"] == 12
    # bf16 rounding of the merged weights moves logits far less than the tolerance.
    assert figures["max_merged_logit_diff"] < TOLERANCE / 5
    assert figures["max_logit_gap"] <= TOLERANCE and figures["seconds"] > 0


def test_config_scale_unlike_training_fails_parity(pstore, cache_root, trained):
    """adapter_config.json says lora_alpha 64 where the job trained with 32: a batch would serve
    twice the trained update. The merged and served paths read the config; training did not."""
    broken = copy_adapter(pstore, trained, "adapters/broken-alpha/", lora_alpha=64)

    out = run_parity(request(pstore, cache_root, broken))

    assert out["servable"] is False
    figures = out["parity"]
    assert figures["check"] == "parity_merged_mismatch" and not figures["passed"]
    assert out["reason"].startswith("Serving-parity check parity_merged_mismatch: on held-out prompt ")
    assert figures["paths"]["merged"]["agree"] is False and figures["paths"]["served"]["agree"] is False
    assert figures["max_logit_gap"] > TOLERANCE


def test_adapter_that_never_stops_fails_end_of_turn(pstore, cache_root, base):
    """An adapter as peft initialises it (B = 0): every path agrees exactly, but the random base
    never writes <|im_end|>, so batch answers would run to max_tokens."""
    job = make_job(pstore, cache_root)
    files = adapter_files(build_model(job, base, torch.device("cpu")), base)
    for name, data in files.items():
        pstore.put_bytes("adapters/untrained/" + name, data)

    out = run_parity(request(pstore, cache_root, "adapters/untrained/", max_tokens=12))

    figures = out["parity"]
    assert (out["servable"], figures["check"]) == (False, "parity_end_of_turn")
    assert out["reason"].startswith("Serving-parity check parity_end_of_turn: 12 of 12 greedy completions")
    assert "<|im_end|>" in out["reason"]
    assert figures["paths"]["merged"]["identical"] == figures["paths"]["served"]["identical"] == 4
    assert figures["eot_ok"] is False and figures["eot_completions"] == 0


@pytest.mark.heavy  # a fresh Ray worker imports torch, transformers and peft: tens of seconds on 2 shared cores
def test_a_check_that_cannot_run_is_parity_check_error(pstore, cache_root, ray_cluster):
    """Through its Ray task: no adapter under the prefix. The job still succeeds (the controller
    registers the model not servable), so the failure is recorded, never raised."""
    out = check_parity(request(pstore, cache_root, "adapters/missing/"), resources={"CPU": 1}, timeout_s=120,
                       keep_going=lambda: True)

    assert out["servable"] is False
    assert out["parity"]["check"] == "parity_check_error" and out["parity"]["error"]
    assert out["reason"].startswith("Serving-parity check parity_check_error: the check could not run (")


def test_held_out_lines_are_the_trainers_holdout_or_the_validation_rows(pstore):
    pstore.put_bytes("files/acct/valid.jsonl", b'{"messages": []}\n\n{"messages": []}\n')
    assert held_out_lines(pstore, "files/acct/valid.jsonl", None) == [1, 2]
    rows = len(ticket_splits()[0])
    pstore.put_bytes(TRAIN_KEY, tickets_jsonl(ticket_splits()[0]))
    assert held_out_lines(pstore, TRAIN_KEY, 7) == sorted(holdout_lines(rows, 7))


def _ref(tokens, tops):
    return Completion(tuple(tokens), tuple(tuple(i for i, _ in t) for t in tops), tuple(tuple(v for _, v in t) for t in tops))


def test_agreement_rule_prices_the_first_difference_with_the_reference_logits():
    ref = _ref([5, 7, 2], [[(5, 3.0), (9, 1.0)], [(7, 2.00), (8, 1.99), (4, 0.5)], [(2, 4.0), (3, 1.0)]])
    same = compare(ref, (5, 7, 2))
    assert (same.identical, same.compared, same.margin) == (True, 3, None)
    tie = compare(ref, (5, 8, 1, 1))  # a float tie at position 2: continuations may part
    assert (tie.identical, tie.compared, tie.position) == (False, 2, 1) and tie.margin == pytest.approx(0.01)
    real = compare(ref, (9,))
    assert (real.position, real.margin) == (0, pytest.approx(2.0))
    outside = compare(ref, (5, 6))  # not in the reference's top-k: its smallest kept logit bounds the margin
    assert outside.margin == pytest.approx(1.5)
    longer = compare(_ref([5], [[(5, 1.0), (9, 0.9)]]), (5, 9))
    assert longer.margin == float("inf")


def test_a_reinforcement_jobs_prompts_are_its_rows_messages_with_its_completion_budget(pstore, cache_root, tokenizer, base):
    """A reinforcement row is all prompt (no answer to size the budget by): the job's max_completion_tokens."""
    from train.parity import held_out_prompts

    rows = [{"messages": [{"role": "user", "content": t}], "label": label} for t, label in ticket_splits()[1][:3]]
    pstore.put_bytes("files/acct/prompts.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    req = request(pstore, cache_root, "unused/", method_type="reinforcement", prompts_key="files/acct/prompts.jsonl",
                  holdout_seed=None, prompts=2, answer_tokens=5)
    prompts = held_out_prompts(req, pstore, tokenizer, base)
    assert [p.line for p in prompts] == [1, 2] and [p.max_tokens for p in prompts] == [5, 5]
    from pipelines.generate import render_prompt

    assert prompts[0].ids == tuple(render_prompt(rows[0]["messages"], tokenizer, base))
