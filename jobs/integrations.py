"""The `integrations` of a job create body: OpenAI's `wandb` type and our `mlflow` extension,
validated and normalized into the wire form the job object returns and the job spec stores.

Where it sits: jobs/params.py `parse_create_request` calls `parse_integrations`; job create
(serve_app/services/fine_tuning_jobs.py) calls `check_available` with the server's settings; the job object returns the
stored wire form as it is (openai-python parses it as `FineTuningJobWandbIntegrationObject`);
the forwarder (train/integrations/forwarder.py) reads it back typed with `from_wire`. Pure functions.

Decisions (OpenAI's reference fixes only the shapes):
- `wandb`: `project` required, a string of 1 to 128 characters without `/ \\ # ? % :` (what the
  wandb library itself refuses); `entity` and `name` null or strings of 1 to 128; `tags` null or
  up to 32 strings of 1 to 64 characters (wandb's tag limit). The stored form carries all four
  keys, null where not given, as OpenAI's job object does.
- `mlflow`: `{"experiment": str (required), "run_name": str | null, "tags": {str: str} | null}`;
  MLflow tags are key/value pairs, so `tags` is an object (16 pairs, keys up to 250 characters,
  values up to 5000), not wandb's list.
- One integration per type. Credentials never come from a request: a key such as `api_key` in
  either object is refused `unsupported_parameter`, naming the setting the operator uses instead;
  other unknown keys are `unknown_parameter`.
- A type the server has not set up (settings: OPENFT_WANDB_MODE, OPENFT_MLFLOW_TRACKING_URI) is
  refused at create, `integration_not_available`, param `integrations[i].type`.
- Messages name fields and limits, never the values sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openft.errors import InvalidRequest, unknown_parameter
from openft.settings import Settings

TYPES = ("wandb", "mlflow")
MAX_INTEGRATIONS = len(TYPES)
NAME_CHARS = 128
WANDB_FORBIDDEN = "/\\#?%:"
WANDB_TAGS, WANDB_TAG_CHARS = 32, 64
MLFLOW_TAGS, MLFLOW_TAG_KEY_CHARS, MLFLOW_TAG_VALUE_CHARS = 16, 250, 5000
# Names a caller might put a credential under; each is refused with the setting that holds it.
CREDENTIAL_KEYS = frozenset({"api_key", "apikey", "key", "token", "password", "secret", "credentials", "auth"})
SETTING = {"wandb": "OPENFT_WANDB_API_KEY", "mlflow": "OPENFT_MLFLOW_TRACKING_URI"}
FIELDS = {"wandb": ("project", "entity", "name", "tags"), "mlflow": ("experiment", "run_name", "tags")}


@dataclass(frozen=True)
class WandbIntegration:
    project: str
    entity: str | None
    name: str | None
    tags: tuple[str, ...]


@dataclass(frozen=True)
class MlflowIntegration:
    experiment: str
    run_name: str | None
    tags: dict[str, str]


Integration = WandbIntegration | MlflowIntegration


def _invalid(message: str, param: str | None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def parse_integrations(raw: Any) -> tuple[dict[str, Any], ...]:
    """The normalized wire form of each integration; raises `InvalidRequest` on the first fault."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_INTEGRATIONS:
        raise _invalid(f"integrations must be a list of at most {MAX_INTEGRATIONS} objects.", "integrations")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        path = f"integrations[{i}]"
        if not isinstance(item, dict):
            raise _invalid(f'{path} must be an object {{"type": "wandb", "wandb": {{...}}}}.', path)
        kind = item.get("type")
        if kind is None:
            raise _invalid(f"{path}.type is required: wandb or mlflow.", f"{path}.type", "missing_required_parameter")
        if kind not in TYPES:
            raise _invalid(f"{path}.type must be wandb or mlflow.", f"{path}.type")
        if any(seen["type"] == kind for seen in out):
            raise _invalid(f"{path}.type {kind} is given twice; send one {kind} integration.", f"{path}.type",
                           "conflicting_parameters")
        for key in item:
            if key in CREDENTIAL_KEYS:
                raise _credential(kind, f"{path}.{key}")
            if key not in ("type", kind):
                raise unknown_parameter(key, path)
        settings = item.get(kind)
        if settings is None:
            raise _invalid(f"{path}.{kind} is required.", f"{path}.{kind}", "missing_required_parameter")
        if not isinstance(settings, dict):
            raise _invalid(f"{path}.{kind} must be an object.", f"{path}.{kind}")
        parse = _wandb if kind == "wandb" else _mlflow
        out.append({"type": kind, kind: parse(settings, f"{path}.{kind}")})
    return tuple(out)


def _credential(kind: str, param: str) -> InvalidRequest:
    return _invalid(
        f"{param}: credentials are not taken from requests; the server's operator sets them ({SETTING[kind]}). "
        "Remove it.",
        param, "unsupported_parameter",
    )


def _keys(settings: dict, kind: str, path: str) -> None:
    for key in settings:
        if key in CREDENTIAL_KEYS:
            raise _credential(kind, f"{path}.{key}")
        if key not in FIELDS[kind]:
            raise unknown_parameter(key, path)


def _name(settings: dict, key: str, path: str, *, required: bool = False, forbidden: str = "") -> str | None:
    value = settings.get(key)
    param = f"{path}.{key}"
    if value is None:
        if required:
            raise _invalid(f"{param} is required.", param, "missing_required_parameter")
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= NAME_CHARS or value.strip() != value:
        raise _invalid(f"{param} must be a string of 1 to {NAME_CHARS} characters, without leading or trailing spaces.",
                       param)
    if any(char in value for char in forbidden):
        raise _invalid(f"{param} cannot contain any of {' '.join(forbidden)}.", param)
    return value


def _wandb(settings: dict, path: str) -> dict[str, Any]:
    _keys(settings, "wandb", path)
    tags = settings.get("tags")
    if tags is not None:
        ok = isinstance(tags, list) and len(tags) <= WANDB_TAGS and all(
            isinstance(tag, str) and 1 <= len(tag) <= WANDB_TAG_CHARS for tag in tags)
        if not ok:
            raise _invalid(f"{path}.tags must be a list of at most {WANDB_TAGS} strings of 1 to {WANDB_TAG_CHARS} "
                           "characters.", f"{path}.tags")
    return {
        "project": _name(settings, "project", path, required=True, forbidden=WANDB_FORBIDDEN),
        "entity": _name(settings, "entity", path, forbidden=WANDB_FORBIDDEN),
        "name": _name(settings, "name", path),
        "tags": list(tags) if tags is not None else None,
    }


def _mlflow(settings: dict, path: str) -> dict[str, Any]:
    _keys(settings, "mlflow", path)
    tags = settings.get("tags")
    if tags is not None:
        ok = isinstance(tags, dict) and len(tags) <= MLFLOW_TAGS and all(
            isinstance(k, str) and 1 <= len(k) <= MLFLOW_TAG_KEY_CHARS and isinstance(v, str)
            and len(v) <= MLFLOW_TAG_VALUE_CHARS and not k.startswith(("mlflow.", "openft."))
            for k, v in tags.items())
        if not ok:
            raise _invalid(
                f"{path}.tags must be an object of at most {MLFLOW_TAGS} pairs: keys of 1 to {MLFLOW_TAG_KEY_CHARS} "
                f"characters not starting with mlflow. or openft., string values of at most {MLFLOW_TAG_VALUE_CHARS}.",
                f"{path}.tags")
    return {
        "experiment": _name(settings, "experiment", path, required=True),
        "run_name": _name(settings, "run_name", path),
        "tags": dict(tags) if tags is not None else None,
    }


def available(settings: Settings) -> frozenset[str]:
    """The integration types this server has set up."""
    kinds = set()
    if settings.wandb_mode != "off":
        kinds.add("wandb")
    if settings.mlflow_tracking_uri:
        kinds.add("mlflow")
    return frozenset(kinds)


def check_available(integrations: tuple[dict[str, Any], ...], settings: Settings) -> None:
    """Refuse a type the operator has not set up: the job would log nowhere."""
    offered = available(settings)
    for i, item in enumerate(integrations):
        if item["type"] not in offered:
            setting = "OPENFT_WANDB_MODE" if item["type"] == "wandb" else "OPENFT_MLFLOW_TRACKING_URI"
            raise _invalid(
                f"integrations[{i}].type {item['type']} is not set up on this server ({setting}); remove it, or ask "
                "the operator to set it up.",
                f"integrations[{i}].type", "integration_not_available",
            )


def from_wire(item: dict[str, Any]) -> Integration:
    """The typed form of one stored (already validated) integration."""
    body = item[item["type"]]
    if item["type"] == "wandb":
        return WandbIntegration(body["project"], body.get("entity"), body.get("name"), tuple(body.get("tags") or ()))
    return MlflowIntegration(body["experiment"], body.get("run_name"), dict(body.get("tags") or {}))
