"""POST /v1/files/distill through the SDK: batch requests + results -> training and validation files."""

from __future__ import annotations

import io

import openai
import pytest

from pipelines.distill import DistillOptions, distill_local
from tests.factories import distill_files


def _upload(client, data: bytes, purpose: str):
    return client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose=purpose)


def _distill(client, **body):
    return client.post("/files/distill", body=body, cast_to=object)


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_distill_makes_validated_files_matching_the_rules(account, fmt):
    client, _, _ = account
    results, requests, _ = distill_files(fmt, 700, seed=3)
    res = _upload(client, results, "batch_output")
    req = _upload(client, requests, "batch")
    out = _distill(client, results_file=res.id, requests_file=req.id, require_json=True, seed=7)
    train_oracle, eval_oracle, dropped = distill_local(
        [results], [requests], DistillOptions(require_json=True, seed=7)
    )
    assert out["counts"]["dropped"] == dropped
    assert all(dropped[reason] > 0 for reason in ("no_request", "errored", "refused", "truncated", "empty", "invalid_json"))
    train, valid = out["training_file"], out["validation_file"]
    assert client.files.content(train["id"]).content == train_oracle
    assert client.files.content(valid["id"]).content == eval_oracle
    assert train["purpose"] == "fine-tune" and train["gridline"]["rows"] == out["counts"]["training_rows"]
    assert train["gridline"]["derived_from"]["results_file"] == res.id
    assert train["gridline"]["derived_from"]["options"]["seed"] == 7
    again = _distill(client, results_file=res.id, requests_file=req.id, require_json=True, seed=7)
    assert client.files.content(again["training_file"]["id"]).content == train_oracle
    other = _distill(client, results_file=res.id, requests_file=req.id, require_json=True, seed=8)
    assert client.files.content(other["training_file"]["id"]).content != train_oracle
    total = out["counts"]["training_rows"] + out["counts"]["validation_rows"]
    assert other["counts"]["training_rows"] + other["counts"]["validation_rows"] == total


def test_distill_refusals_create_nothing(account):
    client, _, _ = account
    results, requests, _ = distill_files("openai", 50, seed=1)
    res = _upload(client, results, "batch_output")
    req = _upload(client, requests, "batch")
    before = {f.id for f in client.files.list().data}
    cases = [
        ({"results_file": req.id, "requests_file": req.id}, "invalid_file_purpose", "results_file"),
        ({"results_file": res.id, "requests_file": "file-nope"}, "file_not_found", "requests_file"),
        ({"results_file": res.id, "requests_file": req.id, "eval_fraction": 1.5}, "invalid_value", "eval_fraction"),
        ({"results_file": res.id, "requests_file": req.id, "colour": "red"}, "unknown_parameter", "colour"),
    ]
    for body, code, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            _distill(client, **body)
        assert (info.value.body["code"], info.value.body["param"]) == (code, param)
    mixed = _upload(client, results.split(b"\n", 1)[0] + b"\n" + distill_files("anthropic", 5)[0], "batch_output")
    with pytest.raises(openai.BadRequestError) as info:
        _distill(client, results_file=mixed.id, requests_file=req.id)
    assert info.value.body["code"] == "mixed_formats" and "line 2" in info.value.body["message"]
    assert {f.id for f in client.files.list().data} == before | {mixed.id}
