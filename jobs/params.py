"""The create body of `POST /v1/fine_tuning/jobs` as a normalized `JobSpec`, and the file-level
admission rules a job's files must pass.

Where it sits: job create (serve_app/services/fine_tuning_jobs.py) calls `parse_create_request` on
the JSON body, looks the named files up (jobs/files.py: a missing or foreign file is
`file_not_found`), runs `check_job_files` on what the files table records, then jobs/quote.py
`quote_job`. Pure functions: no HTTP, database or Ray.

Decisions (not fixed by the reference):
- Every refusal is `InvalidRequest` (400) with `param` the dotted path the caller used
  (`hyperparameters.lora_rank` or `method.supervised.hyperparameters.lora_rank`). Codes:
  `unknown_parameter` (a field we do not know, or `beta` on a supervised job; a name longer than
  64 characters is not echoed: param is the object holding it, null at the top level),
  `missing_required_parameter`, `invalid_value` (wrong type or out of range: a string where a
  number is expected is `invalid_value`, as is `true` for an integer), `model_not_available`
  (from the catalog), `unsupported_method` (reinforcement, param `method.type`),
  `unsupported_parameter` (a credential in `integrations`; jobs/integrations.py has their rules),
  `conflicting_parameters` (hyperparameters in both places, `learning_rate` with a multiplier,
  `method.dpo` settings on a supervised method), `file_not_found`, `invalid_file_purpose`,
  `file_not_ready`, `invalid_file_format`.
- `"auto"` and `null` mean the default where OpenAI allows `"auto"` (`n_epochs`, `batch_size`,
  `learning_rate_multiplier`, `beta`); our own keys take numbers only. An empty hyperparameters
  object carries no settings, so it never conflicts with the other place.
- `beta` may sit in either hyperparameters place of a DPO job. Integers must be JSON integers
  (`2.0` is refused). `seed` is 0 to 2**31-1 so that any SQL integer column holds it.
- The holdout is `openft.holdout.holdout_size` (rows // 20 clamped to 1..1000), the same rule the trainer splits with.
- Messages name fields and numbers, never metadata, file ids or row content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from catalog.bases import BASES, BaseModelSpec, get_base
from graders.validate import Rules
from jobs.integrations import parse_integrations
from jobs._values import float_in as _float_in
from jobs._values import int_in as _int_in
from jobs._values import invalid as _invalid
from jobs import reinforcement
from jobs.lineage import Parent
from jobs.spec import JobSpec
from openft.errors import InvalidRequest, unknown_parameter
from openft.holdout import holdout_size
from openft.limits import FINE_TUNE_FILE_BYTES, MIB

CREATE_FIELDS = frozenset(
    {"model", "training_file", "validation_file", "hyperparameters", "method", "seed", "metadata", "suffix", "integrations"}
)
METHOD_TYPES = ("supervised", "dpo", "reinforcement")
ADAPTERS = ("lora", "qlora")
HYPERPARAMETER_KEYS = (
    "n_epochs", "batch_size", "learning_rate_multiplier", "learning_rate", "lora_rank", "lora_alpha", "max_seq_length", "beta"
)
# A reinforcement job's keys: OpenAI's seven and ours (jobs/reinforcement.py).
METHOD_KEYS = {"supervised": HYPERPARAMETER_KEYS, "dpo": HYPERPARAMETER_KEYS,
               "reinforcement": reinforcement.OPENAI_KEYS + reinforcement.OWN_KEYS}
AUTO_KEYS = frozenset({"n_epochs", "batch_size", "learning_rate_multiplier", "beta"}) | reinforcement.AUTO_KEYS
BASE_LEARNING_RATE = {"supervised": 2e-4, "dpo": 5e-6, "reinforcement": reinforcement.BASE_LEARNING_RATE}
MIN_LEARNING_RATE = {"supervised": 1e-6, "dpo": 5e-8, "reinforcement": reinforcement.MIN_LEARNING_RATE}
MAX_LEARNING_RATE = 1e-2
DEFAULT_BETA = 0.1
SHORT_CONTEXT = 2048
MIN_SEQ_LENGTH = 128
MAX_SEED = 2**31 - 1
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
SUFFIX_CHARS = 64

ROW_KIND = {"supervised": "chat", "dpo": "preference", "reinforcement": "reinforcement"}
MIN_TRAINING_ROWS = 10


@dataclass(frozen=True)
class FileFacts:
    """What the files table records for a processed upload."""

    id: str
    purpose: str
    status: str  # uploaded | processed | error
    bytes: int
    row_kind: str | None  # chat | preference
    rows: int
    messages: int
    content_bytes: int
    token_upper_bound: int
    token_estimates: dict[str, int]  # per base id; absent for files uploaded before the estimate


def parse_create_request(
    body: dict, *, seed_factory: Callable[[], int], parent: Parent | None = None, grader_rules: Rules | None = None
) -> JobSpec:
    """Validate a create body and fill every default; raises `InvalidRequest` on the first fault.
    `parent`: what `model` names when it is an ft: model or checkpoint (jobs/lineage.py `find_parent`);
    `grader_rules`: how a reinforcement job's grader is checked (the caller's models for model graders)."""
    if not isinstance(body, dict):
        raise _invalid("The request body must be a JSON object.", None, "invalid_request")
    for key in body:
        if key not in CREATE_FIELDS:
            raise unknown_parameter(key)
    model = _string(body, "model", required=True)
    base = get_base(parent.base_id if parent is not None else model)
    training_file = _string(body, "training_file", required=True)
    validation_file = _string(body, "validation_file")
    method_type, adapter, method_hp, grader = _method(body.get("method"), base)
    raw, path = _hyperparameters_source(body.get("hyperparameters"), method_hp, method_type)
    hp = _hyperparameters(raw, path, base, method_type, adapter, parent)
    if method_type == "reinforcement":
        hp["grader"] = reinforcement.parse_grader(grader, "method.reinforcement.grader", grader_rules)
    suffix = _suffix(body.get("suffix"))
    integrations = parse_integrations(body.get("integrations"))
    seed = body.get("seed")
    return JobSpec(
        model=base.id,
        method_type=method_type,
        adapter=adapter,
        seed=seed_factory() if seed is None else _int_in(seed, "seed", 0, MAX_SEED),
        metadata=_metadata(body.get("metadata")),
        suffix=suffix,
        training_file=training_file,
        validation_file=validation_file,
        warnings=("suffix_ignored",) if suffix else (),
        integrations=integrations,
        parent=parent.record() if parent is not None else None,
        **hp,
    )


def _string(body: dict, key: str, *, required: bool = False) -> str | None:
    value = body.get(key)
    if value is None and required:
        raise _invalid(f"{key} is required.", key, "missing_required_parameter")
    if value is not None and (not isinstance(value, str) or not value):
        raise _invalid(f"{key} must be a non-empty string.", key)
    return value


_METHOD_FORMS = 'method must be "lora", "qlora" or an object {"type": "supervised" | "dpo" | "reinforcement", ...}.'


def _method(raw: Any, base: BaseModelSpec) -> tuple[str, str, Any, Any]:
    """(method type, adapter, the method's own hyperparameters or None, a reinforcement job's grader as sent)."""
    if raw is None:
        return "supervised", base.default_adapter, None, None
    if isinstance(raw, str):
        if raw == "reinforcement":
            raise _invalid('Reinforcement fine-tuning needs a grader: send method {"type": "reinforcement", '
                           '"reinforcement": {"grader": {...}}}.', "method")
        if raw not in ADAPTERS:
            raise _invalid(_METHOD_FORMS, "method")
        return "supervised", _adapter(raw, base, "method"), None, None
    if not isinstance(raw, dict):
        raise _invalid(_METHOD_FORMS, "method")
    for key in raw:
        if key != "type" and key not in METHOD_TYPES:
            raise unknown_parameter(key, "method")
    method_type = raw.get("type")
    if method_type is None:
        raise _invalid("method.type is required: supervised, dpo or reinforcement.", "method.type",
                       "missing_required_parameter")
    if method_type not in METHOD_TYPES:
        raise _invalid("method.type must be supervised, dpo or reinforcement.", "method.type")
    for other in METHOD_TYPES:
        if other != method_type and raw.get(other) is not None:
            raise _invalid(
                f"method.{other} is given but method.type is {method_type}; put the settings under method.{method_type}.",
                f"method.{other}",
                "conflicting_parameters",
            )
    settings = raw.get(method_type)
    settings = {} if settings is None else settings
    if not isinstance(settings, dict):
        raise _invalid(f"method.{method_type} must be an object.", f"method.{method_type}")
    allowed = ("hyperparameters", "adapter", "grader") if method_type == "reinforcement" else ("hyperparameters", "adapter")
    for key in settings:
        if key not in allowed:
            raise unknown_parameter(key, f"method.{method_type}")
    adapter = settings.get("adapter")
    adapter = base.default_adapter if adapter is None else _adapter(adapter, base, f"method.{method_type}.adapter")
    return method_type, adapter, settings.get("hyperparameters"), settings.get("grader")


def _adapter(value: Any, base: BaseModelSpec, param: str) -> str:
    if value not in ADAPTERS:
        raise _invalid(f'{param} must be "lora" or "qlora".', param)
    if value not in base.adapters:
        raise _invalid(f"{base.id} trains with {' or '.join(base.adapters)} only; use {base.default_adapter}.", param)
    return value


def _hyperparameters_source(top: Any, in_method: Any, method_type: str) -> tuple[dict, str]:
    """The one hyperparameters object the caller sent, and the dotted path it was sent under."""
    method_path = f"method.{method_type}.hyperparameters"
    for value, path in ((top, "hyperparameters"), (in_method, method_path)):
        if value is not None and not isinstance(value, dict):
            raise _invalid(f"{path} must be an object.", path)
    if top and in_method:
        raise _invalid(
            f"Send hyperparameters once: in hyperparameters or in {method_path}, not both.",
            "hyperparameters",
            "conflicting_parameters",
        )
    if top:
        return top, "hyperparameters"
    return in_method or {}, method_path


def _hyperparameters(
    raw: dict, path: str, base: BaseModelSpec, method_type: str, adapter: str, parent: Parent | None
) -> dict[str, Any]:
    for key in raw:
        if key not in METHOD_KEYS[method_type]:
            raise unknown_parameter(key, path)
    if raw.get("beta") is not None and method_type == "supervised":
        raise _invalid(f"{path}.beta applies to DPO and reinforcement jobs only (method.type dpo or reinforcement).",
                       f"{path}.beta", "unknown_parameter")

    def given(key: str) -> Any:
        value = raw.get(key)
        return None if value == "auto" and key in AUTO_KEYS else value

    def int_or(key: str, default: int, lo: int, hi: int) -> int:
        value = given(key)
        return default if value is None else _int_in(value, f"{path}.{key}", lo, hi)

    lr, lrm = given("learning_rate"), given("learning_rate_multiplier")
    if lr is not None and lrm is not None:
        raise _invalid(
            "Send learning_rate or learning_rate_multiplier, not both.", f"{path}.learning_rate", "conflicting_parameters"
        )
    if lr is None:
        lrm = 1.0 if lrm is None else _float_in(lrm, f"{path}.learning_rate_multiplier", 0.01, 10)
        lr = BASE_LEARNING_RATE[method_type] * lrm
    else:
        lr = _float_in(lr, f"{path}.learning_rate", MIN_LEARNING_RATE[method_type], MAX_LEARNING_RATE)

    beta = None
    if method_type == "dpo":
        beta = given("beta")
        beta = DEFAULT_BETA if beta is None else _float_in(beta, f"{path}.beta", 0, 2, open_low=True)
    elif method_type == "reinforcement":  # the KL coefficient; 0 drops the KL term (Dr. GRPO, DAPO)
        beta = given("beta")
        beta = reinforcement.KL_BETA if beta is None else _float_in(beta, f"{path}.beta", 0, 2)

    max_seq_length = int_or("max_seq_length", SHORT_CONTEXT, MIN_SEQ_LENGTH, 10**9)
    lora_rank = int_or("lora_rank", parent.lora_rank if parent else 16, 1, 10**9)
    lora_alpha = int_or("lora_alpha", parent.lora_alpha if parent else 32, 1, 256)
    if parent is not None:
        _check_parent(parent, lora_rank, lora_alpha, path)
    _check_context(max_seq_length, lora_rank, base, method_type, adapter, path)
    extra = reinforcement.hyperparameters(given, path, base) if method_type == "reinforcement" else {}
    return extra | {
        "n_epochs": int_or("n_epochs", 1, 1, 10),
        "batch_size": int_or("batch_size", 8, 1, 64),
        "learning_rate": lr,
        "learning_rate_multiplier": lrm,
        "lora_rank": lora_rank,
        "lora_alpha": lora_alpha,
        "max_seq_length": max_seq_length,
        "beta": beta,
    }


def _check_parent(parent: Parent, rank: int, alpha: int, path: str) -> None:
    """The new adapter starts from the parent's weights, so it keeps their shape and scale."""
    for key, given, theirs in (("lora_rank", rank, parent.lora_rank), ("lora_alpha", alpha, parent.lora_alpha)):
        if given != theirs:
            raise _invalid(
                f"{key} {given} differs from the parent model's {key} {theirs}: a job that continues from an ft: "
                f"model keeps its adapter's {key}; leave {key} out or set it to {theirs}.",
                f"{path}.{key}",
            )


def _check_context(max_seq_length: int, rank: int, base: BaseModelSpec, method_type: str, adapter: str, path: str) -> None:
    """The base's rank cap for the method, and the long-context rules above 2,048 tokens."""
    limit = base.max_seq_length if method_type == "supervised" else SHORT_CONTEXT
    if max_seq_length > limit:
        where = {"dpo": "DPO", "reinforcement": "reinforcement fine-tuning"}.get(method_type, base.id)
        fix = "lower max_seq_length"
        if not base.long_context:
            long_bases = ", ".join(b.id for b in BASES.values() if b.long_context)
            fix += f", or train on {long_bases}, which support up to 8,192 with supervised fine-tuning"
        raise _invalid(
            f"max_seq_length {max_seq_length} is above {limit:,}, the limit for {where}; {fix}.", f"{path}.max_seq_length"
        )
    max_rank = base.max_rank_for(method_type)
    if rank > max_rank:
        method_name = "dpo" if method_type == "dpo" else adapter
        raise _invalid(
            f"lora_rank {rank} is above {max_rank}, the largest rank for {base.id} with method {method_name}; lower lora_rank.",
            f"{path}.lora_rank",
        )
    if max_seq_length > SHORT_CONTEXT and rank > base.long_context_max_rank:
        raise _invalid(
            f"lora_rank {rank} is above {base.long_context_max_rank}, the largest rank for {base.id} with max_seq_length "
            f"above 2,048; lower lora_rank or max_seq_length.",
            f"{path}.lora_rank",
        )


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > METADATA_PAIRS:
        raise _invalid(f"metadata must be an object of at most {METADATA_PAIRS} pairs.", "metadata")
    for key, value in raw.items():
        if not isinstance(key, str) or len(key) > METADATA_KEY_CHARS or not isinstance(value, str) or len(value) > METADATA_VALUE_CHARS:
            raise _invalid(
                f"metadata keys are strings of at most {METADATA_KEY_CHARS} characters, values strings of at most "
                f"{METADATA_VALUE_CHARS}.",
                "metadata",
            )
    return dict(raw)


def _suffix(raw: Any) -> str | None:
    if raw is not None and (not isinstance(raw, str) or len(raw) > SUFFIX_CHARS):
        raise _invalid(f"suffix must be a string of at most {SUFFIX_CHARS} characters.", "suffix")
    return raw


def file_not_found(param: str) -> InvalidRequest:
    """For the service: the named file does not exist or belongs to another account."""
    return _invalid(
        f"{param} does not name a file of yours. Upload it with purpose=fine-tune and pass its id.", param, "file_not_found"
    )


def eval_rows_for(spec: JobSpec, training: FileFacts, validation: FileFacts | None) -> int:
    """Rows evaluated before and after training: the validation file, else a 5 % holdout."""
    if validation is not None:
        return validation.rows
    return holdout_size(training.rows)


def check_job_files(spec: JobSpec, training: FileFacts, validation: FileFacts | None) -> None:
    """The admission rules that need only the files table: purpose, status, size, row kind, rows."""
    for param, facts in (("training_file", training), ("validation_file", validation)):
        if facts is not None:
            _check_file(spec, param, facts)
    held_out = 0 if validation is not None else eval_rows_for(spec, training, None)
    if training.rows - held_out < MIN_TRAINING_ROWS:
        besides = f" besides the {held_out} held out for evaluation" if held_out else ""
        raise _invalid(
            f"training_file has {training.rows} rows; a job needs at least {MIN_TRAINING_ROWS} training rows{besides}. "
            "Add rows" + (", or give a validation_file so that none are held out." if held_out else "."),
            "training_file",
            "invalid_file_format",
        )


def _check_file(spec: JobSpec, param: str, facts: FileFacts) -> None:
    if facts.purpose != "fine-tune":
        raise _invalid(
            f"{param} has purpose {facts.purpose}; upload the file with purpose=fine-tune.", param, "invalid_file_purpose"
        )
    if facts.status == "error":
        raise _invalid(
            f"{param} failed validation at upload; fix the line its status_details names and upload it again.",
            param,
            "invalid_file_format",
        )
    if facts.status != "processed":
        raise _invalid(f"{param} is still being validated; create the job once its status is processed.", param, "file_not_ready")
    if facts.bytes > FINE_TUNE_FILE_BYTES:
        raise _invalid(
            f"{param} is {facts.bytes / MIB:.1f} MiB; a job's training and validation files are each at most "
            f"{FINE_TUNE_FILE_BYTES // MIB} MiB. "
            "Split the data or drop rows.",
            param,
            "invalid_file_format",
        )
    wanted = ROW_KIND[spec.method_type]
    if facts.row_kind != wanted:
        raise _invalid(
            f"{param} holds {facts.row_kind or 'unknown'} rows; a {spec.method_type} job trains on {wanted} rows: "
            f"{_ROW_FIX[spec.method_type]}.",
            param,
            "invalid_file_format",
        )


_ROW_FIX = {
    "supervised": 'upload chat rows ({"messages": [...]} with an assistant turn) or use method.type dpo for preference '
                  "rows, reinforcement for prompts",
    "dpo": "upload preference rows (input, preferred_output, non_preferred_output) or use method.type supervised",
    # A file holds one kind of row (the upload refuses a mix), so its first line already has the wrong shape.
    "reinforcement": "from line 1 on, the file's rows are not prompts; upload rows whose messages end with a user "
                     "turn and hold no assistant turn, with the fields the grader reads",
}


def check_validation_file(spec: JobSpec, validation: FileFacts) -> None:
    """The files-table rules on a validation_file alone: a distill-shortcut job's training file is
    made later, on the controller, and checked with `check_job_files` then."""
    _check_file(spec, "validation_file", validation)
