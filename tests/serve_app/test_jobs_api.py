"""The fine-tuning jobs API through the official `openai` SDK against the Serve app (SQLite and
PostgreSQL): every create example of both references, every refusal (and that it creates nothing),
list and events pagination, retrieve, other accounts, suffix and seed, and a restart."""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest
from openai.types.fine_tuning import (
    DpoHyperparameters,
    DpoMethod,
    SupervisedHyperparameters,
    SupervisedMethod,
)

from openft.demo_data import ticket_splits, tickets_jsonl
from tests.conftest import redeploy
from tests.factories import chat_row, jsonl, message, preference_row, reinforcement_method

TRAIN_ROWS, VALID_ROWS = 12, 5
TRAIN = tickets_jsonl(ticket_splits()[0][:TRAIN_ROWS])
VALID = tickets_jsonl(ticket_splits()[1][:VALID_ROWS])
PREFS = jsonl(preference_row(f"Capital of country {i}?", f"City {i}.", f"Town {i}.") for i in range(TRAIN_ROWS))
PREFS_VALID = jsonl(preference_row(f"Largest city of region {i}?", f"City {i}.", f"Town {i}.") for i in range(3))
TEN_ROWS = tickets_jsonl(ticket_splits()[0][:10])  # one held out leaves 9
MARKER = "ZQX-SECRET-ROW-TEXT"
# OpenAI's examples name gpt-4o-mini (o4-mini for reinforcement); our catalog's stand-ins for them.
OPENAI_MODEL, OPENAI_REASONING_MODEL = "qwen2.5-1.5b-instruct", "qwen3-8b"

QUOTE_KEYS = {
    "training_tokens_upper_bound", "training_tokens_per_epoch_upper_bound", "n_epochs", "eval_rows",
    "estimated_seconds", "estimated_usd", "basis", "per_token", "estimate", "gpu_memory_class_gb",
}
PER_TOKEN_KEYS = {"trained_usd_per_mtok", "minimum_usd", "max_charge_usd"}


def upload(client, data: bytes):
    return client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")


def job_ids(client) -> list[str]:
    return [j.id for j in client.fine_tuning.jobs.list(limit=100).data]


def refused(client, *, status: int = 400, **create) -> dict:
    """Create, expect the refusal, check that no job appeared; returns the error body."""
    before = job_ids(client)
    with pytest.raises(openai.APIStatusError) as info:
        client.fine_tuning.jobs.create(**create)
    assert info.value.status_code == status
    assert job_ids(client) == before
    body = info.value.body
    assert MARKER not in body["message"]
    return body


@dataclass
class Files:
    """One account's uploads: (id, recorded `gridline` facts) per file."""

    client: openai.OpenAI
    facts: dict[str, dict]
    ids: dict[str, str]


def upload_all(client, named: dict[str, bytes]) -> Files:
    uploaded = {name: upload(client, data) for name, data in named.items()}
    return Files(client, {f.id: f.model_extra["gridline"] for f in uploaded.values()},
                 {name: f.id for name, f in uploaded.items()})


@pytest.fixture(scope="module")
def examples(api) -> Files:
    """An account allowed many open jobs, with a chat and a preference training/validation pair."""
    _, key = api.create_account(open_jobs=50)
    return upload_all(api.client(key), {"train": TRAIN, "valid": VALID, "prefs": PREFS, "prefs_valid": PREFS_VALID})


@pytest.fixture(scope="module")
def refusals(api) -> Files:
    """An account that only ever sees refusals (its job list stays empty), with files in every state."""
    _, key = api.create_account()
    client = api.client(key)
    files = upload_all(client, {"train": TRAIN, "valid": VALID, "prefs": PREFS, "ten": TEN_ROWS, "deleted": TRAIN})
    client.files.delete(files.ids["deleted"])
    _, other_key = api.create_account()
    files.ids["foreign"] = upload(api.client(other_key), TRAIN).id
    return files


def assert_quote_complete(job, files: Files, *, n_epochs: int = 1, eval_rows: int, gpu: int) -> None:
    quote = job.model_extra["gridline"]["quote"]
    assert set(quote) == QUOTE_KEYS and set(quote["per_token"]) == PER_TOKEN_KEYS
    per_epoch = files.facts[job.training_file]["token_upper_bound"]
    assert quote["training_tokens_per_epoch_upper_bound"] == per_epoch > 0
    assert quote["training_tokens_upper_bound"] == per_epoch * n_epochs
    assert (quote["n_epochs"], quote["eval_rows"], quote["estimate"]) == (n_epochs, eval_rows, True)
    assert quote["estimated_seconds"] > 120 and quote["estimated_usd"] >= 0
    estimate = files.facts[job.training_file]["token_estimates"][job.model]
    assert f"{estimate:,} training tokens per epoch, counted with {job.model}'s estimate" in quote["basis"]
    assert f"at most the charge at {per_epoch:,} tokens per epoch" in quote["basis"]
    per_token = quote["per_token"]
    at_upper_bound = math.ceil(per_epoch * n_epochs * per_token["trained_usd_per_mtok"] / 10_000) / 100
    assert per_token["minimum_usd"] > 0 and per_token["max_charge_usd"] == max(per_token["minimum_usd"], at_upper_bound)
    assert quote["gpu_memory_class_gb"] == gpu
    assert job.estimated_finish == job.created_at + quote["estimated_seconds"]
    assert job.status in ("queued", "validating_files") and job.object == "fine_tuning.job"
    assert re.fullmatch(r"ftjob-[0-9a-f]{32}", job.id) and job.integrations == [] and job.error is None


# --- every create example of both references ---------------------------------------------------


def test_gridline_examples(api, examples):
    client, ids = examples.client, examples.ids
    job = client.fine_tuning.jobs.create(
        model="qwen2.5-7b-instruct", training_file=ids["train"], validation_file=ids["valid"],
    )
    assert_quote_complete(job, examples, eval_rows=VALID_ROWS, gpu=48)
    assert (job.method.type, job.method.supervised.adapter, job.validation_file) == ("supervised", "lora", ids["valid"])

    job = client.fine_tuning.jobs.create(
        model="qwen2.5-1.5b-instruct",
        training_file=ids["train"],
        method={"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {"n_epochs": 2}}},
    )
    assert_quote_complete(job, examples, n_epochs=2, eval_rows=1, gpu=24)
    assert job.method.supervised.adapter == "lora" and job.hyperparameters.n_epochs == 2

    job = client.fine_tuning.jobs.create(
        model="qwen2.5-7b-instruct", training_file=ids["prefs"],
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}},
    )
    assert_quote_complete(job, examples, eval_rows=1, gpu=48)
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.1
    assert "beta" not in job.hyperparameters.model_dump(exclude_unset=True)  # only under method.dpo

    # The curl example, as the same JSON over plain HTTP.
    response = httpx.post(
        api.base_url + "/fine_tuning/jobs",
        headers={"Authorization": f"Bearer {client.api_key}", "Content-Type": "application/json"},
        json={"model": "qwen2.5-7b-instruct", "training_file": ids["train"], "method": "qlora"},
    )
    assert response.status_code == 200
    job = client.fine_tuning.jobs.retrieve(response.json()["id"])
    assert_quote_complete(job, examples, eval_rows=1, gpu=48)
    assert job.method.supervised.adapter == "qlora" and response.json()["gridline"] == job.model_extra["gridline"]


def test_openai_examples(examples):
    jobs, ids = examples.client.fine_tuning.jobs, examples.ids
    job = jobs.create(model=OPENAI_MODEL, training_file=ids["train"])
    assert_quote_complete(job, examples, eval_rows=1, gpu=24)
    assert job.method.supervised.adapter == "qlora"  # the small bases' default

    job = jobs.create(
        training_file=ids["train"],
        model=OPENAI_MODEL,
        method={"type": "supervised", "supervised": SupervisedMethod(hyperparameters=SupervisedHyperparameters(n_epochs=2))},
    )
    assert_quote_complete(job, examples, n_epochs=2, eval_rows=1, gpu=24)
    assert job.method.supervised.hyperparameters.n_epochs == 2

    job = jobs.create(
        training_file=ids["prefs"],
        validation_file=ids["prefs_valid"],
        model=OPENAI_MODEL,
        method={"type": "dpo", "dpo": DpoMethod(hyperparameters=DpoHyperparameters(beta=0.1))},
    )
    assert_quote_complete(job, examples, eval_rows=3, gpu=48)
    assert job.method.dpo.hyperparameters.learning_rate == 5e-6

    job = jobs.create(training_file=ids["train"], validation_file=ids["valid"], model=OPENAI_MODEL)
    assert_quote_complete(job, examples, eval_rows=VALID_ROWS, gpu=24)

    body = refused(
        examples.client,
        training_file=ids["prefs"],
        validation_file=ids["prefs_valid"],
        model=OPENAI_REASONING_MODEL,
        method=reinforcement_method(),
        seed=42,
    )
    # The method is taken (tests/serve_app/test_rft_create.py); these preference files are not prompts.
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")


# --- refusals ------------------------------------------------------------------------------------


def test_unknown_model_and_unknown_field(refusals):
    client, train = refusals.client, refusals.ids["train"]
    body = refused(client, model="gpt-4o-mini", training_file=train)
    assert (body["code"], body["param"]) == ("model_not_available", "model")
    assert "qwen2.5-7b-instruct" in body["message"]
    body = refused(client, model="qwen2.5-7b-instruct", training_file=train, extra_body={"compute_budget": 3})
    assert (body["code"], body["param"]) == ("unknown_parameter", "compute_budget")


@pytest.mark.parametrize("param", ["training_file", "validation_file"])
def test_missing_foreign_and_deleted_files_read_the_same(refusals, param):
    ids = refusals.ids
    bodies = []
    for file_id in ("file-" + "0" * 24, ids["foreign"], ids["deleted"]):
        files = {"training_file": ids["train"], "validation_file": ids["valid"], param: file_id}
        bodies.append(refused(refusals.client, model="qwen2.5-7b-instruct", **files))
    assert bodies[0] == bodies[1] == bodies[2]
    assert (bodies[0]["code"], bodies[0]["param"]) == ("file_not_found", param)
    assert ids["foreign"] not in bodies[1]["message"]


HYPERPARAMETERS_OUT_OF_RANGE = [
    ({"n_epochs": 11}, "n_epochs"),
    ({"batch_size": 0}, "batch_size"),
    ({"learning_rate_multiplier": 10.5}, "learning_rate_multiplier"),
    ({"learning_rate": 0.011}, "learning_rate"),
    ({"lora_rank": 65}, "lora_rank"),
    ({"lora_alpha": 257}, "lora_alpha"),
    ({"max_seq_length": 8193}, "max_seq_length"),
]


@pytest.mark.parametrize("where", ["hyperparameters", "method.supervised.hyperparameters"])
@pytest.mark.parametrize("hp, field", HYPERPARAMETERS_OUT_OF_RANGE)
def test_hyperparameter_out_of_range(refusals, where, hp, field):
    create = {"model": "qwen2.5-7b-instruct", "training_file": refusals.ids["train"]}
    if where == "hyperparameters":
        create["hyperparameters"] = hp
    else:
        create["method"] = {"type": "supervised", "supervised": {"hyperparameters": hp}}
    body = refused(refusals.client, **create)
    assert (body["code"], body["param"]) == ("invalid_value", f"{where}.{field}")
    assert field in body["message"]


@pytest.mark.parametrize(
    "hp, field, words",
    [({"beta": 0}, "beta", "above 0 to 2"), ({"beta": 2.01}, "beta", "above 0 to 2"),
     ({"learning_rate": 4e-8}, "learning_rate", "from 5e-08 to 0.01")],
)
def test_dpo_hyperparameter_out_of_range(refusals, hp, field, words):
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=refusals.ids["prefs"],
                   method={"type": "dpo", "dpo": {"hyperparameters": hp}})
    assert (body["code"], body["param"]) == ("invalid_value", f"method.dpo.hyperparameters.{field}")
    assert words in body["message"]


@pytest.mark.parametrize(
    "create, code, param",
    [
        ({"hyperparameters": {"n_epochs": 2}, "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}},
         "conflicting_parameters", "hyperparameters"),
        ({"method": "reinforcement"}, "invalid_value", "method"),  # the string form has no grader
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "invalid_value", "metadata"),
        ({"metadata": {"k": MARKER * 30}}, "invalid_value", "metadata"),
        ({"suffix": "s" * 65}, "invalid_value", "suffix"),
        # This server has no tracking set up; and a credential is refused before that is asked.
        ({"integrations": [{"type": "wandb", "wandb": {"project": "p"}}]}, "integration_not_available",
         "integrations[0].type"),
        ({"integrations": [{"type": "wandb", "wandb": {"project": "p", "api_key": MARKER}}]}, "unsupported_parameter",
         "integrations[0].wandb.api_key"),
        ({"integrations": [{"type": "mlflow", "mlflow": {"experiment": "e"}, "token": MARKER}]}, "unsupported_parameter",
         "integrations[0].token"),
    ],
)
def test_request_refusals(refusals, create, code, param):
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=refusals.ids["train"], **create)
    assert (body["code"], body["param"]) == (code, param)


@pytest.mark.parametrize(
    "file, method, needs",
    [("train", {"type": "dpo"}, "a dpo job trains on preference rows"),
     ("prefs", None, "a supervised job trains on chat rows")],
)
def test_wrong_row_kind_for_the_method(refusals, file, method, needs):
    extra = {"method": method} if method else {}
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=refusals.ids[file], **extra)
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")
    assert needs in body["message"]


def test_malformed_bodies_and_a_batch_file(api, refusals):
    client = refusals.client
    for content in (b'{"model": ', b'["qwen2.5-7b-instruct"]'):
        response = httpx.post(api.base_url + "/fine_tuning/jobs", content=content,
                              headers={"Authorization": f"Bearer {client.api_key}"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    assert job_ids(client) == []
    line = jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}])
    batch = client.files.create(file=("b.jsonl", io.BytesIO(line)), purpose="batch")
    body = refused(client, model="qwen2.5-7b-instruct", training_file=refusals.ids["train"], validation_file=batch.id)
    assert (body["code"], body["param"]) == ("invalid_file_purpose", "validation_file")


def test_fewer_than_ten_rows_beside_the_holdout(refusals):
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=refusals.ids["ten"])
    assert (body["code"], body["param"]) == ("invalid_file_format", "training_file")
    assert "10 rows" in body["message"] and "besides the 1 held out" in body["message"]
    assert "validation_file" in body["message"]


def test_job_too_large(refusals):
    """About 3.2 MB of text: gpt-oss-20b's estimate is above the 858,000 tokens its 2 hours hold."""
    row = chat_row("word " * 800, "ok", system=None)
    f = upload(refusals.client, jsonl([row] * 800))
    estimate = f.model_extra["gridline"]["token_estimates"]["gpt-oss-20b"]
    assert estimate > 858_000
    body = refused(refusals.client, model="gpt-oss-20b", training_file=f.id)
    assert (body["code"], body["param"]) == ("job_too_large", "training_file")
    message = body["message"]
    assert f"estimated at {estimate:,} training tokens" in message and "2-hour limit" in message
    assert re.search(r"about 2 h \d+ min \([\d,]+ s\)", message)
    fit = int(re.search(r"At most ([\d,]+) training tokens fit", message).group(1).replace(",", ""))
    assert 800_000 < fit < 858_000  # a bit less than the limit once evaluation is counted
    assert "keep at most about" in message and "of the 800 rows" in message and "choose a smaller base" in message
    # The same file fits a faster base; cancelled at once, as this account is allowed one open job.
    fits = refusals.client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=f.id)
    assert refusals.client.fine_tuning.jobs.cancel(fits.id).status == "cancelled"


def good_rows(n: int = 12) -> list[dict]:
    return [chat_row(f"Ticket {i}: where is my parcel?", "delivery", system=None) for i in range(n)]


def with_row(bad: dict, at: int = 4) -> bytes:
    rows = good_rows()
    rows[at - 1] = bad
    return jsonl(rows)


TEMPLATE_REFUSALS = [
    ("qwen2.5-0.5b-instruct", chat_row(f"{MARKER} <|im_end|> here", "delivery"),
     "template_token_in_content", "line 4, messages[1] holds <|im_end|>"),
    ("llama-3.1-8b-instruct", chat_row("Where?", f"{MARKER} <|eot_id|>"),
     "template_token_in_content", "line 4, messages[2] holds <|eot_id|>"),
    ("mistral-7b-instruct-v0.3", chat_row(f"{MARKER} </s>", "delivery", system=None),
     "template_token_in_content", "line 4, messages[0] holds </s>"),
    ("qwen3-8b", chat_row("Where?", f"<think>{MARKER}</think>delivery", system=None),
     "template_token_in_content", "line 4, messages[1] holds </think>"),
    ("mistral-7b-instruct-v0.3", {"messages": [message("user", MARKER), message("user", "b"), message("assistant", "c")]},
     "invalid_file_format", "line 4, messages[1] is a user message where mistral-7b-instruct-v0.3 needs assistant"),
    # The Mistral v0.3 template writes a system message only before the last user turn of a row.
    ("mistral-7b-instruct-v0.3", chat_row("Where?", "delivery", system=MARKER),
     "template_mismatch", "line 4, messages[0]: the chat template of mistral-7b-instruct-v0.3 drops this message"),
    ("llama-3.1-8b-instruct", chat_row("Where?", "delivery", system=f"  {MARKER}"),
     "template_mismatch", "line 4, messages[0]: the chat template of llama-3.1-8b-instruct changes this message"),
]


@pytest.mark.parametrize("model, bad, code, words", TEMPLATE_REFUSALS)
def test_template_refusals_name_line_and_message(refusals, model, bad, code, words):
    f = upload(refusals.client, with_row(bad))
    body = refused(refusals.client, model=model, training_file=f.id)
    assert (body["code"], body["param"]) == (code, "training_file")
    assert body["message"].startswith(words)


def test_template_refusal_in_the_validation_file(refusals):
    train = upload(refusals.client, jsonl(good_rows()))
    valid = upload(refusals.client, with_row(chat_row("Where?", f"{MARKER} <|endoftext|>"), at=2))
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=train.id, validation_file=valid.id)
    assert (body["code"], body["param"]) == ("template_token_in_content", "validation_file")
    assert body["message"].startswith("line 2, messages[2] holds <|endoftext|>")


def test_preference_row_template_refusal(refusals):
    rows = [preference_row(f"Capital of country {i}?", f"City {i}.", f"Town {i}.") for i in range(12)]
    rows[4] = preference_row("Capital?", f"{MARKER} <|im_end|>", "Lyon.")
    f = upload(refusals.client, jsonl(rows))
    body = refused(refusals.client, model="qwen2.5-7b-instruct", training_file=f.id, method={"type": "dpo"})
    assert (body["code"], body["param"]) == ("template_token_in_content", "training_file")
    assert body["message"].startswith("line 5, preferred_output[0] holds <|im_end|>")


def test_large_file_is_checked_on_ray_data_and_names_the_global_line(apis):
    """Above the inline threshold create checks the file as a Ray Data job over byte ranges.
    Run once, on SQLite: the check reads the object store, not the database, and its cold Ray
    Data workers cost ~20 s a run."""
    sqlite = apis("sqlite")
    _, key = sqlite.create_account()
    client = sqlite.client(key)
    row = orjson.dumps(chat_row("word " * 800, "delivery")) + b"\n"
    n = sqlite.settings.validate_ray_threshold_bytes // len(row) + 50
    lines = [row] * n
    lines[n - 5] = orjson.dumps(chat_row(f"{MARKER} <|im_end|>", "delivery")) + b"\n"
    f = upload(client, b"".join(lines))
    body = refused(client, model="qwen2.5-0.5b-instruct", training_file=f.id)
    assert (body["code"], body["param"]) == ("template_token_in_content", "training_file")
    assert body["message"].startswith(f"line {n - 4}, messages[1] holds <|im_end|>")


def test_second_open_job_on_a_new_account_is_429(account):
    client, _, _ = account
    train = upload(client, TRAIN).id
    first = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train)
    with pytest.raises(openai.RateLimitError) as info:
        client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train)
    body = info.value.body
    assert (info.value.status_code, body["code"], body["type"]) == (429, "limit_exceeded", "rate_limit_error")
    assert body["limit"] == {"limit": 1, "current": 1}
    assert info.value.response.headers["x-should-retry"] == "false"  # a cap: the same request fails again
    # The official SDK obeys it: with retries on, the refusal costs one request, not three.
    sent = []
    retrying = openai.OpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=2,
                             http_client=openai.DefaultHttpxClient(event_hooks={"request": [sent.append]}))
    with pytest.raises(openai.RateLimitError):
        retrying.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train)
    assert len(sent) == 1
    assert job_ids(client) == [first.id]
    # An open job holds its files; once it ends they can be deleted.
    with pytest.raises(openai.ConflictError) as info:
        client.files.delete(train)
    assert info.value.body["code"] == "file_in_use"
    client.fine_tuning.jobs.cancel(first.id)
    assert client.files.delete(train).deleted
    train = upload(client, TRAIN).id
    assert client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train).status == "queued"


# --- reading jobs --------------------------------------------------------------------------------


def test_list_pages_newest_first_and_filters_metadata(api):
    _, key = api.create_account(open_jobs=5)
    client = api.client(key)
    train = upload(client, TRAIN).id
    tags = [{"team": "search"}, {"team": "ads", "tier": "1"}, None, {"team": "search", "tier": "2"}]
    created = [client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train, metadata=m)
               for m in tags]
    newest_first = [j.id for j in reversed(created)]
    page = client.fine_tuning.jobs.list(limit=3)
    assert [j.id for j in page.data] == newest_first[:3] and page.has_more
    rest = client.fine_tuning.jobs.list(limit=3, after=page.data[-1].id)
    assert [j.id for j in rest.data] == newest_first[3:] and not rest.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == newest_first  # the SDK follows `after`
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "search"})] == [created[3].id, created[0].id]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "search", "tier": "2"})] == [created[3].id]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "search"}, limit=1)] == [created[3].id, created[0].id]
    assert client.fine_tuning.jobs.list(metadata={"team": "none"}).data == []
    assert client.fine_tuning.jobs.retrieve(created[1].id).metadata == {"team": "ads", "tier": "1"}
    with pytest.raises(openai.BadRequestError) as info:
        client.fine_tuning.jobs.list(limit=101)
    assert info.value.body["param"] == "limit"


def test_events_page_newest_first(account):
    client, _, _ = account
    train = upload(client, TRAIN).id
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train, suffix="support-v1")
    client.fine_tuning.jobs.pause(job.id)
    client.fine_tuning.jobs.resume(job.id)
    events = client.fine_tuning.jobs.list_events(job.id, limit=100)
    assert not events.has_more
    assert [e.message for e in reversed(events.data)] == [
        f"Created fine-tuning job: {job.id}",
        "suffix_ignored: suffix is accepted but not used for model names yet.",
        "Files validated, job queued: a worker starts it when capacity is free.",
        "Fine-tuning job paused (was queued).",
        "Fine-tuning job resumed.",
    ]
    ids = [e.id for e in events.data]
    assert all(e.object == "fine_tuning.job.event" and e.id.startswith("ftevent-") for e in events.data)
    first = client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert [e.id for e in first.data] == ids[:2] and first.has_more
    second = client.fine_tuning.jobs.list_events(job.id, limit=2, after=ids[1])
    assert [e.id for e in second.data] == ids[2:4] and second.has_more
    last = client.fine_tuning.jobs.list_events(job.id, limit=2, after=ids[3])
    assert [e.id for e in last.data] == ids[4:] and not last.has_more
    assert [e.id for e in client.fine_tuning.jobs.list_events(job.id, limit=2)] == ids


def test_suffix_is_recorded_with_a_warning_and_seed_is_kept_or_generated(api):
    _, key = api.create_account(open_jobs=3)
    client = api.client(key)
    train = upload(client, TRAIN).id
    given = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train, suffix="support-v1", seed=42)
    assert (given.user_provided_suffix, given.seed) == ("support-v1", 42)
    warnings = [e for e in client.fine_tuning.jobs.list_events(given.id) if e.level == "warn"]
    assert [(e.message.split(":")[0], e.data) for e in warnings] == [("suffix_ignored", {"code": "suffix_ignored"})]
    generated = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train)
    assert generated.user_provided_suffix is None and 0 <= generated.seed < 2**31
    assert client.fine_tuning.jobs.retrieve(generated.id).seed == generated.seed
    assert all(e.level == "info" for e in client.fine_tuning.jobs.list_events(generated.id))


def test_other_accounts_get_404_and_no_key_gets_401(api, account):
    client, _, _ = account
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=upload(client, TRAIN).id)
    _, other_key = api.create_account()
    jobs = api.client(other_key).fine_tuning.jobs
    assert jobs.list().data == []
    for call in (jobs.retrieve, jobs.list_events, jobs.cancel, jobs.pause, jobs.resume):
        with pytest.raises(openai.NotFoundError) as info:
            call(job.id)
        assert info.value.body["code"] == "not_found"
    assert client.fine_tuning.jobs.retrieve(job.id).status == "queued"
    routes = [("GET", ""), ("POST", ""), ("GET", f"/{job.id}"), ("GET", f"/{job.id}/events"),
              ("POST", f"/{job.id}/cancel"), ("POST", f"/{job.id}/pause"), ("POST", f"/{job.id}/resume")]
    for method, path in routes:
        response = httpx.request(method, f"{api.base_url}/fine_tuning/jobs{path}")
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "missing_api_key"
    assert client.fine_tuning.jobs.retrieve(job.id).status == "queued"


def test_jobs_survive_a_restart(api, account, serve_port):
    client, _, key = account
    job = client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=upload(client, TRAIN).id, suffix="s")
    events = client.fine_tuning.jobs.list_events(job.id).data
    again = redeploy(api, serve_port).client(key)
    assert again.fine_tuning.jobs.retrieve(job.id).model_dump() == job.model_dump()
    assert again.fine_tuning.jobs.list_events(job.id).data == events


def test_create_refuses_a_job_that_cannot_fit_the_services_time_limit(apis):
    """A deployment whose `job_time_limit_seconds` (100) is below the quote's start-up allowance:
    every create is refused `job_too_large` on `training_file`, and no job is created."""
    api = apis("short-limit", job_time_limit_seconds=100)
    _, key = api.create_account()
    client = api.client(key)
    train = upload(client, TRAIN).id
    with pytest.raises(openai.BadRequestError) as caught:
        client.fine_tuning.jobs.create(model="qwen2.5-0.5b-instruct", training_file=train)
    body = caught.value.body
    assert (caught.value.status_code, body["code"], body["param"]) == (400, "job_too_large", "training_file")
    assert "over the 100-second limit" in body["message"]
    assert job_ids(client) == []
    assert client.files.retrieve(train).status == "processed"
