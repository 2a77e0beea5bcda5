"""The create body's rules: every example of the two reference documents, every refusal with its
code and param, the defaults, the wire shapes the SDK parses, and the file admission rules."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.fine_tuning import (
    DpoHyperparameters,
    DpoMethod,
    FineTuningJob,
    SupervisedHyperparameters,
    SupervisedMethod,
)

from jobs.params import JobSpec, check_job_files, eval_rows_for, parse_create_request
from openft.errors import InvalidRequest

from tests.factories import reinforcement_method

from . import file_facts

BASE = {"model": "qwen2.5-7b-instruct", "training_file": "file-t"}
SEED = 4242


def parse(body: dict) -> JobSpec:
    return parse_create_request(body, seed_factory=lambda: SEED)


def spec(**overrides) -> JobSpec:
    """The spec every default produces on qwen2.5-7b-instruct."""
    fields = dict(
        model="qwen2.5-7b-instruct", method_type="supervised", adapter="lora", n_epochs=1, batch_size=8,
        learning_rate=2e-4, learning_rate_multiplier=1.0, lora_rank=16, lora_alpha=32, max_seq_length=2048,
        beta=None, seed=SEED, metadata={}, suffix=None, training_file="file-t", validation_file=None, warnings=(),
    )
    fields.update(overrides)
    return JobSpec(**fields)


def refused(body) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


# --- the reference's own examples --------------------------------------------------------------

GRIDLINE_EXAMPLES = [
    (
        {"model": "qwen2.5-7b-instruct", "training_file": "file-t", "validation_file": "file-v"},
        spec(validation_file="file-v"),
    ),
    (
        {
            "model": "qwen2.5-1.5b-instruct",
            "training_file": "file-t",
            "method": {"type": "supervised", "supervised": {"adapter": "lora", "hyperparameters": {"n_epochs": 2}}},
        },
        spec(model="qwen2.5-1.5b-instruct", n_epochs=2),
    ),
    ({"model": "qwen2.5-7b-instruct", "training_file": "file-t", "method": "qlora"}, spec(adapter="qlora")),
    (
        {"model": "qwen2.5-7b-instruct", "training_file": "file-t", "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.1}}}},
        spec(method_type="dpo", learning_rate=5e-6, beta=0.1),
    ),
]


@pytest.mark.parametrize("body, expected", GRIDLINE_EXAMPLES)
def test_gridline_examples_parse(body, expected):
    assert parse(body) == expected


def test_default_adapter_is_qlora_on_small_bases():
    assert parse({"model": "qwen2.5-0.5b-instruct", "training_file": "file-t"}).adapter == "qlora"
    assert parse({"model": "qwen2.5-1.5b-instruct", "training_file": "file-t"}).adapter == "qlora"


class SdkCapture:
    """The real `openai` client over an in-process transport that runs the parser as the router would."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.specs: list[JobSpec] = []
        self.client = openai.OpenAI(
            api_key="k", base_url="http://openft.test/v1", http_client=httpx.Client(transport=httpx.MockTransport(self))
        )

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        try:
            job_spec = parse(body)
        except InvalidRequest as exc:
            return httpx.Response(exc.status, json=exc.body())
        self.specs.append(job_spec)
        return httpx.Response(200, json=job_object(job_spec))


def job_object(job_spec: JobSpec) -> dict:
    return {
        "id": "ftjob-" + "0" * 32, "object": "fine_tuning.job", "created_at": 1721764800, "model": job_spec.model,
        "organization_id": "org-1", "result_files": [], "seed": job_spec.seed, "status": "validating_files",
        "training_file": job_spec.training_file, "validation_file": job_spec.validation_file,
        "hyperparameters": job_spec.hyperparameters_wire(), "method": job_spec.method_wire(),
        "metadata": job_spec.metadata or None,
    }


# OpenAI's examples name gpt-4o-mini; on our catalog that becomes qwen2.5-1.5b-instruct (QLoRA default).
OPENAI_MODEL = "qwen2.5-1.5b-instruct"


def test_openai_examples_parse_through_the_sdk():
    sdk = SdkCapture()
    jobs = sdk.client.fine_tuning.jobs
    jobs.create(model=OPENAI_MODEL, training_file="file-abc123")
    job = jobs.create(
        training_file="file-abc123",
        model=OPENAI_MODEL,
        method={"type": "supervised", "supervised": SupervisedMethod(hyperparameters=SupervisedHyperparameters(n_epochs=2))},
    )
    jobs.create(
        training_file="file-abc",
        validation_file="file-123",
        model=OPENAI_MODEL,
        method={"type": "dpo", "dpo": DpoMethod(hyperparameters=DpoHyperparameters(beta=0.1))},
    )
    jobs.create(training_file="file-abc123", validation_file="file-def456", model=OPENAI_MODEL)

    small = dict(model=OPENAI_MODEL, adapter="qlora", seed=SEED)
    assert sdk.specs == [
        spec(**small, training_file="file-abc123"),
        spec(**small, training_file="file-abc123", n_epochs=2),
        spec(**small, training_file="file-abc", validation_file="file-123", method_type="dpo", learning_rate=5e-6, beta=0.1),
        spec(**small, training_file="file-abc123", validation_file="file-def456"),
    ]
    assert sdk.bodies[1]["method"] == {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}
    assert job.method.supervised.hyperparameters.n_epochs == 2
    assert job.hyperparameters.n_epochs == 2


def test_openai_reinforcement_example_parses_through_the_sdk():
    """OpenAI's reinforcement example (o4-mini there, qwen3-8b here: a base with a thinking switch,
    so reasoning_effort medium is taken), every auto resolved in the job object the SDK reads back."""
    sdk = SdkCapture()
    job = sdk.client.fine_tuning.jobs.create(
        training_file="file-abc", validation_file="file-123", model="qwen3-8b", method=reinforcement_method(), seed=42)
    [parsed] = sdk.specs
    assert (parsed.method_type, parsed.seed, parsed.samples_per_prompt, parsed.compute_multiplier) == (
        "reinforcement", 42, 8, 1.0)
    assert parsed.grader == {"type": "string_check", "name": "Example string check grader", "input": "{{item.label}}",
                             "operation": "eq", "reference": "{{sample.output_text}}"}
    hp = job.method.reinforcement.hyperparameters
    assert (hp.batch_size, hp.compute_multiplier, hp.eval_interval, hp.eval_samples, hp.n_epochs) == (8, 1.0, 10, 1, 1)
    assert (hp.learning_rate_multiplier, hp.reasoning_effort) == (1.0, "medium")
    assert job.method.reinforcement.grader.type == "string_check"
    assert hp.model_extra["samples_per_prompt"] == 8 and hp.model_extra["beta"] == 0.04


# --- wire shapes -------------------------------------------------------------------------------


def test_supervised_wire_validates_as_the_sdk_job():
    job_spec = parse({**BASE, "hyperparameters": {"lora_rank": 8, "max_seq_length": 4096}, "seed": 7})
    job = FineTuningJob.model_validate(job_object(job_spec))
    assert job.hyperparameters.model_dump() == {
        "n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 1.0, "learning_rate": 2e-4,
        "lora_rank": 8, "lora_alpha": 32, "max_seq_length": 4096,
    }
    assert job.method.type == "supervised"
    assert job.method.supervised.adapter == "lora"
    assert job.method.supervised.hyperparameters.lora_rank == 8
    assert job.method.dpo is None


def test_dpo_wire_validates_as_the_sdk_job():
    job_spec = parse({**BASE, "method": {"type": "dpo", "dpo": {"adapter": "qlora", "hyperparameters": {"learning_rate": 1e-7}}}})
    job = FineTuningJob.model_validate(job_object(job_spec))
    assert job.method.type == "dpo"
    assert job.method.dpo.adapter == "qlora"
    assert job.method.dpo.hyperparameters.beta == 0.1
    assert job.method.dpo.hyperparameters.learning_rate_multiplier is None
    assert job.method.dpo.hyperparameters.learning_rate == 1e-7
    # beta lives only where OpenAI puts it: the top-level hyperparameters object has no such field.
    assert "beta" not in job_object(job_spec)["hyperparameters"]
    assert "beta" not in job.hyperparameters.model_dump(exclude_unset=True)


# --- values and defaults -----------------------------------------------------------------------


def test_auto_and_null_mean_the_default():
    hp = {"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto", "lora_rank": None}
    assert parse({**BASE, "hyperparameters": hp}) == spec()
    dpo = {"type": "dpo", "dpo": {"hyperparameters": {"beta": "auto"}}, "supervised": None}
    assert parse({**BASE, "method": dpo}).beta == 0.1


def test_learning_rate_from_the_multiplier_or_given():
    assert parse({**BASE, "hyperparameters": {"learning_rate_multiplier": 0.5}}).learning_rate == 1e-4
    explicit = parse({**BASE, "hyperparameters": {"learning_rate": 3e-4}})
    assert (explicit.learning_rate, explicit.learning_rate_multiplier) == (3e-4, None)
    dpo = parse({**BASE, "method": {"type": "dpo", "dpo": {"hyperparameters": {"learning_rate_multiplier": 2}}}})
    assert (dpo.learning_rate, dpo.learning_rate_multiplier) == (1e-5, 2.0)


ACCEPTED_EDGES = [
    ({"n_epochs": 10}, "n_epochs", 10),
    ({"batch_size": 64}, "batch_size", 64),
    ({"batch_size": 1}, "batch_size", 1),
    ({"learning_rate_multiplier": 0.01}, "learning_rate", 2e-4 * 0.01),
    ({"learning_rate_multiplier": 10}, "learning_rate", 2e-3),
    ({"learning_rate": 1e-6}, "learning_rate", 1e-6),
    ({"learning_rate": 1e-2}, "learning_rate", 1e-2),
    ({"lora_rank": 64}, "lora_rank", 64),
    ({"lora_alpha": 1}, "lora_alpha", 1),
    ({"lora_alpha": 256}, "lora_alpha", 256),
    ({"max_seq_length": 128}, "max_seq_length", 128),
    ({"max_seq_length": 8192, "lora_rank": 16}, "max_seq_length", 8192),
]


@pytest.mark.parametrize("hp, field, value", ACCEPTED_EDGES)
def test_range_edges_are_accepted(hp, field, value):
    assert getattr(parse({**BASE, "hyperparameters": hp}), field) == value


def test_dpo_edges_are_accepted():
    def dpo(**hp):
        return parse({**BASE, "method": {"type": "dpo", "dpo": {"hyperparameters": hp}}})

    assert dpo(beta=2).beta == 2.0
    assert dpo(learning_rate=5e-8).learning_rate == 5e-8
    assert dpo(lora_rank=26).lora_rank == 26
    assert dpo(beta=0.5, n_epochs=3).n_epochs == 3  # beta may sit beside the shared keys
    assert parse({**BASE, "method": {"type": "dpo"}, "hyperparameters": {"beta": 0.3}}).beta == 0.3


def test_seed_metadata_suffix_integrations():
    calls = []
    parse_create_request(BASE, seed_factory=lambda: calls.append(1) or 9)
    got = parse_create_request({**BASE, "seed": 0}, seed_factory=lambda: calls.append(1) or 9)
    assert (got.seed, len(calls)) == (0, 1)
    metadata = {f"k{i}".ljust(64, "x"): "v" * 512 for i in range(16)}
    full = parse({**BASE, "metadata": metadata, "suffix": "s" * 64, "integrations": [], "seed": 2**31 - 1})
    assert (full.metadata, full.suffix, full.warnings, full.seed) == (metadata, "s" * 64, ("suffix_ignored",), 2**31 - 1)
    assert parse({**BASE, "integrations": None, "suffix": None}).warnings == ()
    wandb = parse({**BASE, "integrations": [{"type": "wandb", "wandb": {"project": "p"}}]})
    assert wandb.integrations == ({"type": "wandb", "wandb": {"project": "p", "entity": None, "name": None, "tags": None}},)
    assert JobSpec.from_record(wandb.record()) == wandb


# --- refusals ----------------------------------------------------------------------------------

TOP_REFUSALS = [
    ({"foo": 1}, "unknown_parameter", "foo"),
    ({"k" * 64: 1}, "unknown_parameter", "k" * 64),
    ({"k" * 65: 1}, "unknown_parameter", None),  # too long to echo (openft.errors.ECHOED_NAME_CHARS)
    ({"hyperparameters": {"k" * 65: 1}}, "unknown_parameter", "hyperparameters"),
    ({"method": {"type": "supervised", "k" * 65: {}}}, "unknown_parameter", "method"),
    ({"method": {"type": "supervised", "supervised": {"k" * 65: 1}}}, "unknown_parameter", "method.supervised"),
    ({"model": "gpt-4o-mini"}, "model_not_available", "model"),
    ({"model": "ft:qwen2.5-7b-instruct:o1:abc"}, "model_not_available", "model"),
    ({"model": None}, "missing_required_parameter", "model"),
    ({"training_file": None}, "missing_required_parameter", "training_file"),
    ({"training_file": 5}, "invalid_value", "training_file"),
    ({"validation_file": ""}, "invalid_value", "validation_file"),
    ({"method": "reinforcement"}, "invalid_value", "method"),
    ({"method": {"type": "reinforcement", "reinforcement": {"grader": {}}}}, "missing_required_parameter",
     "method.reinforcement.grader.type"),
    ({"method": {"type": "reinforcement", "reinforcement": {}}}, "missing_required_parameter",
     "method.reinforcement.grader"),
    ({"method": "full"}, "invalid_value", "method"),
    ({"method": 3}, "invalid_value", "method"),
    ({"method": {}}, "missing_required_parameter", "method.type"),
    ({"method": {"type": "rl"}}, "invalid_value", "method.type"),
    ({"method": {"type": "supervised", "extra": {}}}, "unknown_parameter", "method.extra"),
    ({"method": {"type": "dpo", "supervised": {"adapter": "lora"}}}, "conflicting_parameters", "method.supervised"),
    ({"method": {"type": "supervised", "supervised": []}}, "invalid_value", "method.supervised"),
    ({"method": {"type": "supervised", "supervised": {"lr": 1}}}, "unknown_parameter", "method.supervised.lr"),
    ({"method": {"type": "supervised", "supervised": {"adapter": "full"}}}, "invalid_value", "method.supervised.adapter"),
    ({"model": "gpt-oss-20b", "method": "qlora"}, "invalid_value", "method"),
    ({"model": "qwen3.5-9b", "method": {"type": "dpo", "dpo": {"adapter": "qlora"}}}, "invalid_value", "method.dpo.adapter"),
    (
        {"hyperparameters": {"n_epochs": 2}, "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}}},
        "conflicting_parameters",
        "hyperparameters",
    ),
    ({"hyperparameters": "fast"}, "invalid_value", "hyperparameters"),
    ({"method": {"type": "dpo", "dpo": {"hyperparameters": 1}}}, "invalid_value", "method.dpo.hyperparameters"),
    ({"seed": -1}, "invalid_value", "seed"),
    ({"seed": 2**31}, "invalid_value", "seed"),
    ({"seed": "1"}, "invalid_value", "seed"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_value", "metadata"),
    ({"metadata": {"k" * 65: "v"}}, "invalid_value", "metadata"),
    ({"metadata": {"k": "v" * 513}}, "invalid_value", "metadata"),
    ({"metadata": {"k": 1}}, "invalid_value", "metadata"),
    ({"metadata": ["k"]}, "invalid_value", "metadata"),
    ({"suffix": "s" * 65}, "invalid_value", "suffix"),
    ({"suffix": 5}, "invalid_value", "suffix"),
    ({"integrations": [{"type": "wandb", "wandb": {"project": "p", "api_key": "k"}}]}, "unsupported_parameter",
     "integrations[0].wandb.api_key"),
    ({"integrations": "wandb"}, "invalid_value", "integrations"),
]


@pytest.mark.parametrize("change, code, param", TOP_REFUSALS)
def test_refusals(change, code, param):
    exc = refused({**BASE, **change})
    assert (exc.code, exc.param) == (code, param)


def test_a_body_that_is_not_an_object_is_refused():
    exc = refused([BASE])
    assert (exc.code, exc.param) == ("invalid_request", None)


# Each runs twice: in `hyperparameters` and in `method.<type>.hyperparameters`; param follows.
HYPERPARAMETER_REFUSALS = [
    ("supervised", "qwen2.5-7b-instruct", {"foo": 1}, "unknown_parameter", "foo"),
    ("supervised", "qwen2.5-7b-instruct", {"beta": 0.1}, "unknown_parameter", "beta"),
    ("supervised", "qwen2.5-7b-instruct", {"n_epochs": 0}, "invalid_value", "n_epochs"),
    ("supervised", "qwen2.5-7b-instruct", {"n_epochs": 11}, "invalid_value", "n_epochs"),
    ("supervised", "qwen2.5-7b-instruct", {"n_epochs": "2"}, "invalid_value", "n_epochs"),
    ("supervised", "qwen2.5-7b-instruct", {"n_epochs": 2.0}, "invalid_value", "n_epochs"),
    ("supervised", "qwen2.5-7b-instruct", {"n_epochs": True}, "invalid_value", "n_epochs"),
    ("supervised", "qwen2.5-7b-instruct", {"batch_size": 0}, "invalid_value", "batch_size"),
    ("supervised", "qwen2.5-7b-instruct", {"batch_size": 65}, "invalid_value", "batch_size"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate_multiplier": 0.009}, "invalid_value", "learning_rate_multiplier"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate_multiplier": 10.5}, "invalid_value", "learning_rate_multiplier"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate_multiplier": "high"}, "invalid_value", "learning_rate_multiplier"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate_multiplier": float("nan")}, "invalid_value", "learning_rate_multiplier"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate": 9e-7}, "invalid_value", "learning_rate"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate": 0.011}, "invalid_value", "learning_rate"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate": "auto"}, "invalid_value", "learning_rate"),
    ("supervised", "qwen2.5-7b-instruct", {"learning_rate": 1e-4, "learning_rate_multiplier": 2}, "conflicting_parameters", "learning_rate"),
    ("supervised", "qwen2.5-7b-instruct", {"lora_rank": 0}, "invalid_value", "lora_rank"),
    ("supervised", "qwen2.5-7b-instruct", {"lora_rank": 65}, "invalid_value", "lora_rank"),
    ("supervised", "qwen2.5-7b-instruct", {"lora_rank": "auto"}, "invalid_value", "lora_rank"),
    ("supervised", "qwen3.5-9b", {"lora_rank": 37}, "invalid_value", "lora_rank"),
    ("supervised", "qwen2.5-7b-instruct", {"lora_alpha": 0}, "invalid_value", "lora_alpha"),
    ("supervised", "qwen2.5-7b-instruct", {"lora_alpha": 257}, "invalid_value", "lora_alpha"),
    ("supervised", "qwen2.5-7b-instruct", {"max_seq_length": 127}, "invalid_value", "max_seq_length"),
    ("supervised", "qwen2.5-7b-instruct", {"max_seq_length": 8193}, "invalid_value", "max_seq_length"),
    ("supervised", "mistral-7b-instruct-v0.3", {"max_seq_length": 2049}, "invalid_value", "max_seq_length"),
    ("supervised", "qwen2.5-0.5b-instruct", {"max_seq_length": 4096}, "invalid_value", "max_seq_length"),
    ("supervised", "qwen3-8b", {"max_seq_length": 4096, "lora_rank": 17}, "invalid_value", "lora_rank"),
    ("dpo", "qwen2.5-7b-instruct", {"max_seq_length": 4096}, "invalid_value", "max_seq_length"),
    ("dpo", "qwen2.5-7b-instruct", {"lora_rank": 27}, "invalid_value", "lora_rank"),
    ("dpo", "qwen2.5-1.5b-instruct", {"lora_rank": 58}, "invalid_value", "lora_rank"),
    ("dpo", "qwen2.5-7b-instruct", {"learning_rate": 4e-8}, "invalid_value", "learning_rate"),
    ("dpo", "qwen2.5-7b-instruct", {"beta": 0}, "invalid_value", "beta"),
    ("dpo", "qwen2.5-7b-instruct", {"beta": -1}, "invalid_value", "beta"),
    ("dpo", "qwen2.5-7b-instruct", {"beta": 2.01}, "invalid_value", "beta"),
    ("dpo", "qwen2.5-7b-instruct", {"beta": "high"}, "invalid_value", "beta"),
]


@pytest.mark.parametrize("where", ["top", "method"])
@pytest.mark.parametrize("method_type, model, hp, code, field", HYPERPARAMETER_REFUSALS)
def test_hyperparameter_refusals_name_the_path_used(where, method_type, model, hp, code, field):
    body = {"model": model, "training_file": "file-t", "method": {"type": method_type}}
    if where == "top":
        body["hyperparameters"] = hp
        prefix = "hyperparameters"
    else:
        body["method"][method_type] = {"hyperparameters": hp}
        prefix = f"method.{method_type}.hyperparameters"
    exc = refused(body)
    assert (exc.code, exc.param) == (code, f"{prefix}.{field}")


def test_refusal_messages_say_what_to_do():
    rank = refused({**BASE, "hyperparameters": {"lora_rank": 96}})
    assert rank.message == "lora_rank 96 is above 64, the largest rank for qwen2.5-7b-instruct with method lora; lower lora_rank."
    long = refused({**BASE, "hyperparameters": {"max_seq_length": 4096, "lora_rank": 32}})
    assert long.message == (
        "lora_rank 32 is above 16, the largest rank for qwen2.5-7b-instruct with max_seq_length above 2,048; "
        "lower lora_rank or max_seq_length."
    )
    short = refused({"model": "qwen2.5-0.5b-instruct", "training_file": "file-t", "hyperparameters": {"max_seq_length": 4096}})
    assert short.message == (
        "max_seq_length 4096 is above 2,048, the limit for qwen2.5-0.5b-instruct; lower max_seq_length, or train on "
        "qwen2.5-7b-instruct, qwen3-8b, llama-3.1-8b-instruct, which support up to 8,192 with supervised fine-tuning."
    )
    secret = refused({**BASE, "metadata": {"k": "secret-value" * 50}})
    assert "secret" not in secret.message


# --- the files ---------------------------------------------------------------------------------

SUPERVISED = spec()
DPO = spec(method_type="dpo", learning_rate=5e-6, beta=0.1)


@pytest.mark.parametrize(
    "rows, validation_rows, expected",
    [(10, None, 1), (39, None, 1), (40, None, 2), (2000, None, 100), (20_019, None, 1000), (50_000, None, 1000), (10, 3, 3)],
)
def test_eval_rows(rows, validation_rows, expected):
    validation = None if validation_rows is None else file_facts(id="file-v", rows=validation_rows)
    assert eval_rows_for(SUPERVISED, file_facts(rows=rows), validation) == expected


def test_files_that_pass():
    check_job_files(SUPERVISED, file_facts(rows=11), None)  # 11 rows, 1 held out, 10 train
    check_job_files(SUPERVISED, file_facts(rows=10, bytes=64 * 1024 * 1024), file_facts(id="file-v", rows=1))
    check_job_files(DPO, file_facts(row_kind="preference"), file_facts(id="file-v", row_kind="preference"))


FILE_REFUSALS = [
    (SUPERVISED, {"rows": 10}, None, "invalid_file_format", "training_file"),
    (SUPERVISED, {"rows": 9}, {}, "invalid_file_format", "training_file"),
    (SUPERVISED, {"bytes": 64 * 1024 * 1024 + 1}, None, "invalid_file_format", "training_file"),
    (SUPERVISED, {}, {"bytes": 64 * 1024 * 1024 + 1}, "invalid_file_format", "validation_file"),
    (SUPERVISED, {"row_kind": "preference"}, None, "invalid_file_format", "training_file"),
    (SUPERVISED, {}, {"row_kind": "preference"}, "invalid_file_format", "validation_file"),
    (DPO, {"row_kind": "chat"}, None, "invalid_file_format", "training_file"),
    (DPO, {"row_kind": None}, None, "invalid_file_format", "training_file"),
    (SUPERVISED, {"purpose": "batch"}, None, "invalid_file_purpose", "training_file"),
    (SUPERVISED, {}, {"purpose": "batch_output"}, "invalid_file_purpose", "validation_file"),
    (SUPERVISED, {"status": "uploaded"}, None, "file_not_ready", "training_file"),
    (SUPERVISED, {"status": "error"}, None, "invalid_file_format", "training_file"),
]


@pytest.mark.parametrize("job, training, validation, code, param", FILE_REFUSALS)
def test_file_refusals(job, training, validation, code, param):
    with pytest.raises(InvalidRequest) as caught:
        check_job_files(job, file_facts(**training), None if validation is None else file_facts(id="file-v", **validation))
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, code, param)


def test_file_refusal_messages_name_the_fix():
    with pytest.raises(InvalidRequest) as rows:
        check_job_files(SUPERVISED, file_facts(rows=10), None)
    assert rows.value.message == (
        "training_file has 10 rows; a job needs at least 10 training rows besides the 1 held out for evaluation. "
        "Add rows, or give a validation_file so that none are held out."
    )
    with pytest.raises(InvalidRequest) as kind:
        check_job_files(DPO, file_facts(), None)
    assert kind.value.message == (
        "training_file holds chat rows; a dpo job trains on preference rows: upload preference rows "
        "(input, preferred_output, non_preferred_output) or use method.type supervised."
    )
    with pytest.raises(InvalidRequest) as size:
        check_job_files(SUPERVISED, file_facts(bytes=70 * 1024 * 1024), None)
    assert size.value.message.startswith("training_file is 70.0 MiB; a job's training and validation files are each at most 64 MiB.")
