"""bench/gpu_check.py, the GPU readiness check, kept from rotting: its CPU smoke (`--tiny`) runs every
stage on a stand-in, and each stage must run or say why it was skipped, in the JSON shape that
docs/gpu-check.md documents. Speed is not checked (a shared CPU says nothing about a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import STAGES

REPO = Path(__file__).resolve().parents[2]
KEYS = {"stage", "status", "seconds", "reason", "error", "figures", "parts", "peak_memory"}


def run_check(tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "check.jsonl"
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--tiny", "--out", str(out), "--work", str(tmp_path / "work"),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=1260)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")] == lines
    return lines


# In make test-heavy (3 minutes of one worker): make test keeps the failing-stage test below.
@pytest.mark.heavy
@pytest.mark.timeout(1320)  # the smoke's own budget (bench/gpu_check.py TINY_BUDGET_S): minutes more on a loaded machine
def test_every_stage_runs_on_the_stand_in_or_says_why_not(tmp_path):
    *stages, summary = run_check(tmp_path)
    assert [s["stage"] for s in stages] == [s.name for s in STAGES]
    by = {s["stage"]: s for s in stages}
    for s in stages:
        assert set(s) >= KEYS, s["stage"]
        assert s["status"] in ("ok", "skipped"), (s["stage"], s["error"], s.get("traceback"))
        if s["status"] == "skipped":
            assert s["reason"], s["stage"]
        else:
            assert s["figures"] and s["peak_memory"]["device"] == "cpu" and s["peak_memory"]["over_budget"] is False
    # On CPU exactly the CUDA-only parts say so (the reinforcement step is timed on a GPU only).
    assert by["qlora"]["status"] == "skipped" and by["qlora"]["reason"].startswith("no CUDA")
    assert by["rft"]["status"] == "skipped" and by["rft"]["reason"].startswith("no CUDA")
    assert by["sft"]["parts"]["bf16_autocast"]["reason"].startswith("no CUDA")
    assert by["nccl"]["parts"]["nccl_one_rank"] == {"status": "skipped", "reason": "no CUDA"}
    assert by["nccl"]["parts"]["gloo_two_ranks"]["status"] == "ok"
    assert by["batch"]["parts"]["vllm"] == {"status": "skipped", "reason": "no CUDA"}
    assert by["install"]["parts"]["plain_install"]["status"] == "skipped"

    sft = by["sft"]["figures"]
    for side in ("ours", "trl_tuned"):
        assert sft[side]["tokens_per_second"] > 0 and 0 < sft[side]["mfu"], side
    assert sft["trl_tuned"]["settings"]["padding_free"] is True and sft["trl_tuned"]["settings"]["gradient_checkpointing"] is False
    assert "12*L*d_attn*s^2" in sft["flops_formula"]
    long = by["long_context"]["figures"]
    assert long["max_seq_length"] == 8192 and long["gradient_checkpointing"] is True and long["rows"]["max_tokens"] > 2048
    assert by["dpo"]["figures"]["ratio_to_sft_lora"] > 0
    merge = by["merge"]["figures"]
    assert merge["merge_gb_s"] > 0 and merge["copy_gb_s"] > 0 and merge["shards"] > 1
    assert by["batch"]["figures"]["transformers"]["generated_tokens"] > 0
    parity = by["parity"]["figures"]
    assert parity["logit_tolerance"] == 0.5 and set(parity["agrees_within"]) == {"0.05", "0.1", "0.25", "0.5"}
    assert set(by["ray_data"]["figures"]["caps"]) == {"1", "2"}

    assert summary["summary"] is True and summary["stages"] == {s["stage"]: s["status"] for s in stages}
    assert set(summary["targets"]) == {"sft_vs_trl_tuned_at_least_1_5", "sft_mfu_at_least_0_40", "every_stage_within_48gb"}
    # A CPU says nothing about the GPU day's targets.
    assert summary["targets"]["sft_mfu_at_least_0_40"] is None and summary["targets"]["sft_vs_trl_tuned_at_least_1_5"] is None


def test_a_failing_stage_records_its_error_and_the_next_stage_runs(tmp_path):
    # Earlier results, as a reused --work holds them, whose SFT figures lack what DPO reads.
    results = tmp_path / "work" / "results"
    results.mkdir(parents=True)
    for name in ("install", "base", "sft"):
        (results / f"{name}.json").write_text(json.dumps({"stage": name, "status": "ok", "figures": {}}))
    dpo, rft, summary = run_check(tmp_path, "--stages", "dpo,rft")
    assert dpo["status"] == "failed" and "answer_log2_words" in dpo["error"]
    assert rft["status"] == "skipped" and rft["reason"]
    assert summary["stages"] == {"dpo": "failed", "rft": "skipped"} and "dpo" in summary["reasons"]
