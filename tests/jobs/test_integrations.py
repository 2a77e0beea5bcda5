"""The integrations' create-time rules (jobs/integrations.py), without a server."""

from __future__ import annotations

import pytest

from jobs.integrations import (
    MlflowIntegration, WandbIntegration, check_available, from_wire, parse_integrations,
)
from openft.errors import InvalidRequest
from openft.settings import Settings


def test_wandb_is_returned_in_openai_shape_with_nulls_filled():
    [item] = parse_integrations([{"type": "wandb", "wandb": {"project": "p"}}])
    assert item == {"type": "wandb", "wandb": {"project": "p", "entity": None, "name": None, "tags": None}}
    assert from_wire(item) == WandbIntegration("p", None, None, ())


def test_full_wandb_and_mlflow_together():
    got = parse_integrations([
        {"type": "wandb", "wandb": {"project": "p", "entity": "team", "name": "run 1", "tags": ["a", "b" * 64]}},
        {"type": "mlflow", "mlflow": {"experiment": "exp", "run_name": "r", "tags": {"team": "nlp"}}},
    ])
    assert from_wire(got[0]) == WandbIntegration("p", "team", "run 1", ("a", "b" * 64))
    assert from_wire(got[1]) == MlflowIntegration("exp", "r", {"team": "nlp"})
    assert parse_integrations(None) == () and parse_integrations([]) == ()


REFUSALS = [
    ("wandb", "invalid_value", "integrations"),
    ([{"type": "wandb", "wandb": {"project": "p"}}] * 3, "invalid_value", "integrations"),
    (["wandb"], "invalid_value", "integrations[0]"),
    ([{"wandb": {"project": "p"}}], "missing_required_parameter", "integrations[0].type"),
    ([{"type": "comet", "comet": {}}], "invalid_value", "integrations[0].type"),
    ([{"type": "wandb"}], "missing_required_parameter", "integrations[0].wandb"),
    ([{"type": "wandb", "wandb": "p"}], "invalid_value", "integrations[0].wandb"),
    ([{"type": "wandb", "wandb": {}}], "missing_required_parameter", "integrations[0].wandb.project"),
    ([{"type": "wandb", "wandb": {"project": ""}}], "invalid_value", "integrations[0].wandb.project"),
    ([{"type": "wandb", "wandb": {"project": "a/b"}}], "invalid_value", "integrations[0].wandb.project"),
    ([{"type": "wandb", "wandb": {"project": "p" * 129}}], "invalid_value", "integrations[0].wandb.project"),
    ([{"type": "wandb", "wandb": {"project": 3}}], "invalid_value", "integrations[0].wandb.project"),
    ([{"type": "wandb", "wandb": {"project": "p", "entity": "a:b"}}], "invalid_value", "integrations[0].wandb.entity"),
    ([{"type": "wandb", "wandb": {"project": "p", "name": " x"}}], "invalid_value", "integrations[0].wandb.name"),
    ([{"type": "wandb", "wandb": {"project": "p", "tags": "a"}}], "invalid_value", "integrations[0].wandb.tags"),
    ([{"type": "wandb", "wandb": {"project": "p", "tags": ["t" * 65]}}], "invalid_value", "integrations[0].wandb.tags"),
    ([{"type": "wandb", "wandb": {"project": "p", "tags": [""]}}], "invalid_value", "integrations[0].wandb.tags"),
    ([{"type": "wandb", "wandb": {"project": "p", "tags": ["t"] * 33}}], "invalid_value", "integrations[0].wandb.tags"),
    ([{"type": "wandb", "wandb": {"project": "p", "colour": "red"}}], "unknown_parameter",
     "integrations[0].wandb.colour"),
    ([{"type": "wandb", "wandb": {"project": "p"}, "mlflow": {}}], "unknown_parameter", "integrations[0].mlflow"),
    ([{"type": "wandb", "wandb": {"project": "p"}}, {"type": "wandb", "wandb": {"project": "q"}}],
     "conflicting_parameters", "integrations[1].type"),
    ([{"type": "mlflow", "mlflow": {"run_name": "r"}}], "missing_required_parameter", "integrations[0].mlflow.experiment"),
    ([{"type": "mlflow", "mlflow": {"experiment": "e", "tags": ["a"]}}], "invalid_value", "integrations[0].mlflow.tags"),
    ([{"type": "mlflow", "mlflow": {"experiment": "e", "tags": {"mlflow.user": "x"}}}], "invalid_value",
     "integrations[0].mlflow.tags"),
    ([{"type": "mlflow", "mlflow": {"experiment": "e", "tags": {"k": 1}}}], "invalid_value", "integrations[0].mlflow.tags"),
    # Credentials come from the server's settings, never from a request.
    ([{"type": "wandb", "wandb": {"project": "p", "api_key": "k" * 40}}], "unsupported_parameter",
     "integrations[0].wandb.api_key"),
    ([{"type": "wandb", "wandb": {"project": "p"}, "api_key": "k" * 40}], "unsupported_parameter",
     "integrations[0].api_key"),
    ([{"type": "mlflow", "mlflow": {"experiment": "e", "token": "t" * 40}}], "unsupported_parameter",
     "integrations[0].mlflow.token"),
]


@pytest.mark.parametrize("raw,code,param", REFUSALS)
def test_refusals_name_the_field_and_never_echo_the_value(raw, code, param):
    with pytest.raises(InvalidRequest) as refused:
        parse_integrations(raw)
    assert (refused.value.code, refused.value.param) == (code, param)
    assert "k" * 40 not in refused.value.message and "t" * 40 not in refused.value.message


def test_credential_refusal_names_the_setting():
    with pytest.raises(InvalidRequest) as refused:
        parse_integrations([{"type": "wandb", "wandb": {"project": "p", "api_key": "secret-value"}}])
    assert "OPENFT_WANDB_API_KEY" in refused.value.message and "secret-value" not in refused.value.message


def test_a_type_the_server_has_not_set_up_is_refused(tmp_path):
    both = parse_integrations([{"type": "wandb", "wandb": {"project": "p"}},
                               {"type": "mlflow", "mlflow": {"experiment": "e"}}])
    off = Settings(data_dir=tmp_path)
    with pytest.raises(InvalidRequest) as refused:
        check_available(both, off)
    assert (refused.value.code, refused.value.param) == ("integration_not_available", "integrations[0].type")
    with pytest.raises(InvalidRequest) as refused:
        check_available(both, Settings(data_dir=tmp_path, wandb_mode="offline"))
    assert refused.value.param == "integrations[1].type"
    check_available(both, Settings(data_dir=tmp_path, wandb_mode="online", mlflow_tracking_uri="http://127.0.0.1:1"))
    check_available((), off)
