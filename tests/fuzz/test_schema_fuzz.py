"""Schemathesis over the app's own OpenAPI schema, every operation, against the deployed API.

The schema comes in-process from `create_app(settings).openapi()` with the deployment's own
settings (so it lists what that deployment serves, admin routes included only with an admin key).
Each operation gets positive and negative cases, sent with a valid key (the admin key on the
admin routes). Path parameters sometimes name real objects (seeded files, a job, the base
models). The checks: no 5xx; every 4xx is OpenAI's error envelope; every documented 2xx body
conforms to the schema. Failures are collected over all operations and reported together, one
reproducer (curl) per operation and fault.

The app parses three request bodies by hand (an upload, a job create, a distillation), so its
schema documents none; `document_hand_parsed_bodies` adds OpenAI's shapes for them, with real
ids among the values, so their bodies are fuzzed too. Where the app documents a body itself,
its own is used.
"""

from __future__ import annotations

import copy
import io
import time
from collections import Counter

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from serve_app.app import create_app
from tests.fuzz.conftest import ENVELOPE_KEYS
from tests.fuzz.jsonl import MARKER

ID_PARAMS = {"file_id": "files", "fine_tuning_job_id": "jobs", "model": "models", "account": "accounts"}
# Deletions and state changes last, so that the reads still meet the seeded objects.
_LAST = ("delete", "cancel", "pause", "resume")


def _real(schema: dict, ids: list[str]) -> dict:
    return {"anyOf": [schema, {"enum": ids}]} if ids else schema


def document_hand_parsed_bodies(openapi: dict, seeds: dict[str, list[str]]) -> dict:
    openapi = copy.deepcopy(openapi)
    files, models = seeds["files"], seeds["models"]
    string = {"type": "string"}
    bodies = {
        ("/v1/files", "post"): ("multipart/form-data", {
            "type": "object", "required": ["file", "purpose"],
            "properties": {"file": {"type": "string", "format": "binary"},
                           "purpose": {"anyOf": [string, {"enum": ["fine-tune", "batch", "batch_output"]}]}},
        }),
        ("/v1/fine_tuning/jobs", "post"): ("application/json", {
            "type": "object", "required": ["model", "training_file"],
            "properties": {
                "model": _real(string, models), "training_file": _real(string, files),
                "validation_file": _real({"type": ["string", "null"]}, files),
                "hyperparameters": {"type": "object", "properties": {
                    k: {"anyOf": [{"enum": ["auto"]}, {"type": "number"}]}
                    for k in ("n_epochs", "batch_size", "learning_rate_multiplier")}},
                "method": {"type": "object", "properties": {"type": {"enum": ["supervised", "dpo", "reinforcement"]}}},
                "suffix": {"type": ["string", "null"]}, "seed": {"type": ["integer", "null"]},
                "metadata": {"type": ["object", "null"], "additionalProperties": string},
                "integrations": {"type": ["array", "null"]},
            },
        }),
        ("/v1/files/distill", "post"): ("application/json", {
            "type": "object", "required": ["results_file"],
            "properties": {"results_file": _real(string, files), "requests_file": _real(string, files),
                           "require_json": {"type": "boolean"}, "keep_truncated": {"type": "boolean"},
                           "eval_fraction": {"type": "number"}, "seed": {"type": "integer"}},
        }),
    }
    for (path, method), (media, body_schema) in bodies.items():
        operation = openapi["paths"].get(path, {}).get(method)
        if operation is not None and "requestBody" not in operation:
            operation["requestBody"] = {"required": True, "content": {media: {"schema": body_schema}}}
    return openapi


def seed_objects(api, client, account_id: str) -> dict[str, list[str]]:
    """Files, a queued job and the base models, so that path parameters can name real objects."""
    from tests.factories import batch_request_line, chat_row, jsonl

    training = client.files.create(file=("t.jsonl", io.BytesIO(jsonl([chat_row()] * 12))), purpose="fine-tune")
    batch = client.files.create(file=("b.jsonl", io.BytesIO(jsonl([batch_request_line("r1")]))), purpose="batch")
    models = [m.id for m in client.models.list().data]
    job = client.fine_tuning.jobs.create(model=models[0], training_file=training.id)
    return {"files": [training.id, batch.id], "jobs": [job.id], "models": models, "accounts": [account_id]}


def _checks_for(case, response, hidden: bool) -> list[str]:
    """What is wrong with one response: [] when nothing. `hidden`: the route must answer 404 (an
    admin route on a deployment without an admin key) whatever the request."""
    status = response.status_code
    if status >= 500:
        return [f"{status}"]
    problems = [f"{status} from a hidden route"] if hidden and status != 404 else []
    if status >= 400:
        try:
            body = orjson.loads(response.content)
            error = body["error"]
            # An account limit's 429 also carries the effective limit and current use in `error.limit`,
            # as the reference's does (the key cap is reached when the fuzzer creates keys enough).
            extra = set(error) - ENVELOPE_KEYS
            ok = set(body) == {"error"} and ENVELOPE_KEYS <= set(error) and extra <= ({"limit"} if status == 429 else set())
            ok = ok and ("limit" not in error or set(error["limit"]) == {"limit", "current"})
            ok = ok and isinstance(error["message"], str) and isinstance(error["type"], str)
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            ok = False
        if not ok:
            problems.append(f"{status} without the error envelope")
        if MARKER in response.text:
            problems.append(f"{status} echoes the request's text")
    elif 200 <= status < 300:
        try:
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
        except Exception as exc:  # a failed check: recorded with the others, reported at the end
            problems.append(f"{status} body does not match the schema ({type(exc).__name__}: {str(exc)[:200]})")
    return problems


def _operations(schema):
    ops = [result.ok() for result in schema.get_all_operations()]
    return sorted(ops, key=lambda op: (any(w in op.path or op.method == w for w in _LAST), op.path, op.method))


def _strategies(op, seeds: dict[str, list[str]]) -> list:
    """Positive and negative cases, and positive ones whose path names real objects."""
    strategies = [op.as_strategy(generation_mode=GenerationMode.POSITIVE)]
    try:
        strategies.append(op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    except Exception:  # an operation with nothing to negate  # noqa: BLE001
        pass
    real = {name: seeds[kind] for name, kind in ID_PARAMS.items() if "{" + name in op.path and seeds[kind]}
    if real:
        strategies += [
            st.fixed_dictionaries({k: st.sampled_from(v) for k, v in real.items()}).flatmap(
                lambda params: op.as_strategy(generation_mode=GenerationMode.POSITIVE, path_parameters=params))
        ] * 2
    return strategies


def _fuzz_operation(op, seeds, base_url: str, headers: dict, examples: int, derandomize: bool, faults: dict,
                    statuses: Counter, hidden: bool) -> None:
    strategies = _strategies(op, seeds)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.one_of(strategies))
    def run(case):
        response = case.call(base_url=base_url, headers=headers, timeout=120, allow_redirects=False)
        statuses[op.label, response.status_code] += 1
        for problem in _checks_for(case, response, hidden):
            faults.setdefault((op.label, problem.split(" (")[0]), case.as_curl_command(headers=headers))

    run()


def _run(api, examples: int, derandomize: bool, fuzz_report, name: str):
    account_id, key = api.create_account(open_jobs=5)
    seeds = seed_objects(api, api.client(key), account_id)
    openapi = document_hand_parsed_bodies(create_app(api.settings).openapi(), seeds)
    schema = schemathesis.openapi.from_dict(openapi)
    base_url = api.base_url.removesuffix("/v1")
    faults: dict[tuple[str, str], str] = {}
    statuses: Counter = Counter()  # (operation, status) -> requests
    started = time.monotonic()
    for op in _operations(schema):
        is_admin = "/admin/" in op.path
        admin_key = api.settings.admin_key
        headers = {"Authorization": f"Bearer {admin_key if is_admin and admin_key else key}"}
        _fuzz_operation(op, seeds, base_url, headers, examples, derandomize, faults, statuses,
                        hidden=is_admin and not admin_key)
    by_status = Counter()
    for (_, status), n in statuses.items():
        by_status[status] += n
    operations = {label for label, _ in statuses}
    fuzz_report(f"schemathesis [{name}]: {len(operations)} operations, {sum(statuses.values())} requests in "
                f"{time.monotonic() - started:.1f} s, by status {dict(sorted(by_status.items()))}, {len(faults)} faults")
    assert not faults, "\n".join(f"{label}: {problem}\n    {curl}" for (label, problem), curl in sorted(faults.items()))
    assert len(operations) == len(_operations(schema)), "an operation sent no request"


def test_every_operation_sqlite(fuzz_api, fuzz_report):
    _run(fuzz_api, examples=12, derandomize=True, fuzz_report=fuzz_report, name="default, sqlite")


@pytest.mark.fuzz_large
def test_every_operation_postgres_with_admin(fuzz_pg_api, fuzz_report):
    _run(fuzz_pg_api, examples=80, derandomize=False, fuzz_report=fuzz_report,
         name="large, postgres, admin key")
