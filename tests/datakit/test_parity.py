"""The notebook API against the service's own endpoints on the same bytes: every bad line's code and
message is what an upload answers when that line is its first bad one, the token estimates are the
uploaded file's, a template refusal is job create's, and distilled files are the distill endpoint's
files byte for byte (from local paths, from S3 and from a Ray Dataset)."""

from __future__ import annotations

import io
import uuid

import boto3
import openai
import orjson
import pytest

import datakit as dk
from catalog.bases import get_base
from catalog.model_source import load_tokenizer, parse_model_source
from pipelines.distill import DistillError
from tests.factories import batch_request_line, batch_result_line, chat_row, distill_files, jsonl, message, preference_row

pytestmark = pytest.mark.usefixtures("ray_cluster")

BASE = "qwen2.5-0.5b-instruct"
GOOD = chat_row()
BAD = [  # (line, code) of each bad line in FILE below
    (2, "invalid_json"),
    (4, "unsupported_field"),
    (5, "mixed_row_kinds"),
    (6, "invalid_json"),
    (8, "invalid_messages"),
]
FILE = jsonl([
    GOOD,
    b'{"messages": [',
    chat_row("Hi", "Hello"),
    chat_row(extra_messages=[message("assistant", "x", name="bot")]),
    preference_row(),
    b"",
    chat_row("Naïve 東京?", "Yes."),
    {"messages": [message("user", "only a question")]},
])


@pytest.fixture(scope="module")
def service(apis):
    api = apis("sqlite")
    _, key = api.create_account(open_jobs=3)
    return api, api.client(key)


@pytest.fixture(scope="module")
def bucket(seaweed):
    name = f"dk-{uuid.uuid4().hex[:16]}"
    s3 = boto3.client("s3", endpoint_url=seaweed.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket=name)
    return name, s3, dk.S3(seaweed.endpoint_url)


def _upload_error(client, data: bytes) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("f.jsonl", io.BytesIO(data)), purpose="fine-tune")
    return info.value.body


def test_every_bad_line_has_the_code_and_message_an_upload_answers(service, tmp_path):
    _, client = service
    path = tmp_path / "rows.jsonl"
    path.write_bytes(FILE)
    bad = sorted(dk.validate(str(path)).take_all(), key=lambda r: r["line"])
    assert [(r["line"], r["code"]) for r in bad] == BAD
    lines = FILE.split(b"\n")[:-1]
    for row in bad:
        # The file with every other bad line replaced by a good row: this line is the upload's first.
        alone = [line if n == row["line"] or n not in dict(BAD) else orjson.dumps(GOOD) for n, line in enumerate(lines, 1)]
        body = _upload_error(client, b"\n".join(alone) + b"\n")
        assert (body["code"], body["message"], body["param"]) == (row["code"], row["message"], "file")
    written = dk.write_jsonl(dk.validate(str(path)), str(tmp_path / "bad.jsonl"))
    assert [orjson.loads(line) for line in open(written, "rb")] == bad
    (tmp_path / "empty.jsonl").write_bytes(b"")
    [empty] = dk.validate(str(tmp_path / "empty.jsonl")).take_all()
    body = _upload_error(client, b"")
    assert (empty["line"], empty["code"], empty["message"]) == (0, body["code"], body["message"])


def test_token_estimates_are_the_uploaded_files_from_a_path_and_from_s3(service, bucket, tmp_path):
    _, client = service
    name, s3, conf = bucket
    chat = jsonl([chat_row(f"Question {i} naïve?", "Answer " * i) for i in range(1, 30)])
    prefs = jsonl([preference_row(f"Q{i}?", "Yes.", "No.", system="Be brief.") for i in range(12)])
    (tmp_path / "chat.jsonl").write_bytes(chat)
    s3.put_object(Bucket=name, Key="rows/prefs.jsonl", Body=prefs)
    estimates = {**dk.estimate_tokens(str(tmp_path / "chat.jsonl")), **dk.estimate_tokens(f"s3://{name}/rows/*.jsonl", s3=conf)}
    for data, path in ((chat, str(tmp_path / "chat.jsonl")), (prefs, f"s3://{name}/rows/prefs.jsonl")):
        grid = client.files.create(file=("f.jsonl", io.BytesIO(data)), purpose="fine-tune").model_extra["gridline"]
        mine = estimates[path]
        assert mine["bad_lines"] == 0
        assert {k: mine[k] for k in ("row_kind", "rows", "messages", "content_bytes", "token_upper_bound", "token_estimates")} \
            == {k: grid[k] for k in ("row_kind", "rows", "messages", "content_bytes", "token_upper_bound", "token_estimates")}
    assert estimates[str(tmp_path / "chat.jsonl")]["token_estimates"][BASE] > 0


def test_render_gives_the_templates_text_and_job_creates_refusal(service, tmp_path):
    api, client = service
    # enough rows for a job (job create counts them before it renders any)
    rows = [chat_row("Hi", "Hello"), chat_row("What is <|im_end|>?", "A token.")] + [chat_row(f"Bye {i}", "Bye.") for i in range(20)]
    path = tmp_path / "t.jsonl"
    path.write_bytes(jsonl(rows))
    rendered = dk.render(str(path), BASE, model_source="standin", cache_dir=api.settings.model_cache_dir).take_all()
    assert [(r["line"], r["code"]) for r in rendered] == [(1, ""), (2, "template_token_in_content")] + [
        (n, "") for n in range(3, 23)]
    tokenizer = load_tokenizer(get_base(BASE), parse_model_source("standin"), api.settings.model_cache_dir)
    for r, row in zip(rendered, rows):
        if not r["code"]:
            assert r["text"] == tokenizer.apply_chat_template(row["messages"], tokenize=False)
    upload = client.files.create(file=("t.jsonl", io.BytesIO(jsonl(rows))), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.jobs.create(model=BASE, training_file=upload.id)
    body = info.value.body
    assert (body["code"], body["message"], body["param"]) == (rendered[1]["code"], rendered[1]["message"], "training_file")
    prefs = tmp_path / "p.jsonl"
    prefs.write_bytes(jsonl([preference_row()]))
    [pref] = dk.render(str(prefs), BASE, model_source="standin", cache_dir=api.settings.model_cache_dir).take_all()
    assert pref["code"] == "" and pref["text"].endswith("<|im_start|>assistant\n") and pref["chosen"] == "Paris.<|im_end|>"


@pytest.mark.heavy  # make test-heavy: a Ray Data job per variant
def test_datasets_local_paths_and_many_ranges_give_the_same_results(service, tmp_path):
    import ray

    api, client = service
    path = tmp_path / "rows.jsonl"
    path.write_bytes(FILE)
    bad = dk.validate(str(path)).take_all()
    assert [(r["line"], r["code"]) for r in bad] == BAD
    from_text = dk.validate(ray.data.read_text(str(path), drop_empty_lines=False), staging=str(tmp_path / "s"))
    assert [{**r, "path": str(path)} for r in from_text.take_all()] == bad
    rows = [GOOD, chat_row(extra_messages=[message("user", "more?"), message("assistant", "No.", weight=1)])]
    assert dk.validate(ray.data.from_items(rows), staging=str(tmp_path / "s")).count() == 0
    # cut into one range per line or two: line numbers and the file's kind carry across the ranges
    assert dk.validate(str(path), block_bytes=64).take_all() == bad
    rendered = dk.render(str(path), BASE, model_source="standin", cache_dir=api.settings.model_cache_dir)
    ranged = dk.render(str(path), BASE, model_source="standin", cache_dir=api.settings.model_cache_dir, block_bytes=200)
    assert ranged.take_all() == rendered.take_all()
    assert [r["line"] for r in rendered.take_all() if r["code"] == ""] == [1, 3, 7] and len(rendered.take_all()) == 8

    results, requests, _ = distill_files("openai", 240, seed=5)
    train, held_out, _ = _endpoint_distill(client, results, requests, require_json=True, seed=3)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "output.jsonl").write_bytes(results)
    (tmp_path / "in" / "input.jsonl").write_bytes(requests)
    local = dk.distill(str(tmp_path / "in" / "output.jsonl"), str(tmp_path / "in" / "input.jsonl"), str(tmp_path / "out"),
                       require_json=True, seed=3)
    assert (tmp_path / "out" / "train.jsonl").read_bytes() == train
    assert (tmp_path / "out" / "eval.jsonl").read_bytes() == held_out
    ds_train, _ = local.datasets()
    assert [r["text"] for r in ds_train.take_all()] == train.decode().splitlines()

    datasets = [ray.data.read_text(str(tmp_path / "in" / f), drop_empty_lines=False) for f in ("output.jsonl", "input.jsonl")]
    dk.distill(*datasets, str(tmp_path / "from-ds"), require_json=True, seed=3, staging=str(tmp_path / "staging"))
    assert (tmp_path / "from-ds" / "train.jsonl").read_bytes() == train


def _endpoint_distill(client, results: bytes, requests: bytes, **options) -> tuple[bytes, bytes, dict]:
    res = client.files.create(file=("out.jsonl", io.BytesIO(results)), purpose="batch_output")
    req = client.files.create(file=("in.jsonl", io.BytesIO(requests)), purpose="batch")
    out = client.post("/files/distill", body={"results_file": res.id, "requests_file": req.id, **options}, cast_to=object)
    return (client.files.content(out["training_file"]["id"]).content,
            client.files.content(out["validation_file"]["id"]).content, out["counts"])


def test_distill_from_s3_is_the_endpoints_files_byte_for_byte(service, bucket):
    _, client = service
    name, s3, conf = bucket
    results, requests, _ = distill_files("openai", 240, seed=5)
    train, held_out, counts = _endpoint_distill(client, results, requests, require_json=True, seed=3)
    s3.put_object(Bucket=name, Key="batch/output.jsonl", Body=results)
    s3.put_object(Bucket=name, Key="batch/input.jsonl", Body=requests)
    from_s3 = dk.distill(f"s3://{name}/batch/output.jsonl", f"s3://{name}/batch/input.jsonl", f"s3://{name}/distilled",
                         require_json=True, seed=3, s3=conf)
    got = s3.get_object(Bucket=name, Key="distilled/train.jsonl")["Body"].read()
    assert got == train and s3.get_object(Bucket=name, Key="distilled/eval.jsonl")["Body"].read() == held_out
    assert (from_s3.train_rows, from_s3.eval_rows, from_s3.dropped) == (
        counts["training_rows"], counts["validation_rows"], counts["dropped"])
    assert not [k for k in s3.list_objects_v2(Bucket=name, Prefix="distilled/").get("Contents", [])
                if k["Key"] not in ("distilled/train.jsonl", "distilled/eval.jsonl")]



def test_a_refused_results_file_raises_the_endpoints_code_param_and_line(service, tmp_path):
    _, client = service
    results = jsonl([batch_result_line("a"), batch_result_line("b"), batch_result_line("a")])
    requests = jsonl([batch_request_line("a"), batch_request_line("b")])
    (tmp_path / "r.jsonl").write_bytes(results)
    (tmp_path / "q.jsonl").write_bytes(requests)
    with pytest.raises(DistillError) as mine:
        dk.distill(str(tmp_path / "r.jsonl"), str(tmp_path / "q.jsonl"), str(tmp_path / "out"))
    with pytest.raises(openai.BadRequestError) as theirs:
        _endpoint_distill(client, results, requests)
    body = theirs.value.body
    assert (mine.value.code, mine.value.param, mine.value.message) == (body["code"], body["param"], body["message"])
    assert mine.value.line == 3


def test_upload_sends_the_bytes_from_s3_and_a_path_with_a_finished_bar(service, bucket, tmp_path, capsys):
    _, client = service
    name, s3, conf = bucket
    data = jsonl([chat_row(f"Q{i}", "A.") for i in range(200)])
    s3.put_object(Bucket=name, Key="up/rows.jsonl", Body=data)
    (tmp_path / "rows.jsonl").write_bytes(data)
    for source in (f"s3://{name}/up/rows.jsonl", str(tmp_path / "rows.jsonl")):
        f = dk.upload(client, source, s3=conf)
        assert (f.filename, f.bytes, client.files.content(f.id).content) == ("rows.jsonl", len(data), data)
        bar = capsys.readouterr().err.strip().splitlines()[-1]
        assert "upload rows.jsonl: 100%" in bar, bar
    with pytest.raises(openai.BadRequestError) as info:
        dk.upload(client, FILE, filename="bad.jsonl")
    assert info.value.body["code"] == "invalid_json" and "line 2" in info.value.body["message"]


def test_distill_of_an_anthropic_batch_is_the_endpoints_files_byte_for_byte(service, tmp_path):
    _, client = service
    results, requests, _ = distill_files("anthropic", 120, seed=8)
    train, held_out, counts = _endpoint_distill(client, results, requests, keep_truncated=True, eval_fraction=0.25)
    (tmp_path / "results.jsonl").write_bytes(results)
    (tmp_path / "requests.jsonl").write_bytes(requests)
    out = dk.distill(str(tmp_path / "results.jsonl"), str(tmp_path / "requests.jsonl"), str(tmp_path / "out"),
                     keep_truncated=True, eval_fraction=0.25)
    assert (tmp_path / "out" / "train.jsonl").read_bytes() == train
    assert (tmp_path / "out" / "eval.jsonl").read_bytes() == held_out
    assert out.dropped == counts["dropped"] and out.dropped["errored"] > 0


def test_refusals_name_the_option_and_write_nothing(service, bucket, tmp_path):
    from openft.errors import InvalidRequest

    _, client = service
    name, s3, conf = bucket
    results, requests, _ = distill_files("openai", 30, seed=1)
    (tmp_path / "r.jsonl").write_bytes(results)
    (tmp_path / "q.jsonl").write_bytes(requests)
    with pytest.raises(InvalidRequest) as mine:
        dk.distill(str(tmp_path / "r.jsonl"), str(tmp_path / "q.jsonl"), str(tmp_path / "out"), eval_fraction=1.5)
    res = client.files.create(file=("o.jsonl", io.BytesIO(results)), purpose="batch_output")
    req = client.files.create(file=("i.jsonl", io.BytesIO(requests)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as theirs:
        client.post("/files/distill", body={"results_file": res.id, "requests_file": req.id, "eval_fraction": 1.5},
                    cast_to=object)
    assert (mine.value.code, mine.value.param, mine.value.message) == (
        theirs.value.body["code"], theirs.value.body["param"], theirs.value.body["message"])
    s3.put_object(Bucket=name, Key="r/results.jsonl", Body=results)
    with pytest.raises(ValueError, match="one S3 bucket"):
        dk.distill(f"s3://{name}/r/results.jsonl", f"s3://{name}/r/results.jsonl", f"s3://other-{name}/out", s3=conf)
    with pytest.raises(ValueError, match="all local or all in one S3 bucket"):
        dk.distill(f"s3://{name}/r/results.jsonl", str(tmp_path / "q.jsonl"), str(tmp_path / "out"), s3=conf)
    with pytest.raises(InvalidRequest) as base:
        dk.render(str(tmp_path / "q.jsonl"), "gpt-4o")
    assert (base.value.code, base.value.param) == ("model_not_available", "model")
    with pytest.raises(FileNotFoundError):
        dk.validate(str(tmp_path / "nothing-*.jsonl"))
    assert not (tmp_path / "out").exists()
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name, Prefix="r/")["Contents"]] == ["r/results.jsonl"]
