"""Object ids: each carries its prefix, the rest is random hex."""

from __future__ import annotations

import secrets


def new_id(prefix: str, hex_chars: int = 24) -> str:
    return prefix + secrets.token_hex((hex_chars + 1) // 2)[:hex_chars]


def file_id() -> str:
    return new_id("file-", 24)


def job_id() -> str:
    return new_id("ftjob-", 32)


def event_id() -> str:
    return new_id("ftevent-", 24)


def checkpoint_id() -> str:
    return new_id("ftckpt_", 24)


def org_id() -> str:
    return new_id("org-", 12)


# -- batches (issue 13) --
def batch_id() -> str:
    return new_id("batch_", 24)


def batch_request_id() -> str:
    return new_id("batch_req_", 24)


# -- evals (issue 25) --
def eval_id() -> str:
    return new_id("eval_", 32)


def eval_run_id() -> str:
    return new_id("evalrun_", 32)


def eval_output_item_id() -> str:
    return new_id("outputitem_", 28)
