"""A job's success: registering its trained adapter as an `ft:` model (size and format checks, the
account's model quota, the model name, the results CSV) and ending the job `succeeded`, in one
transaction. A job is `succeeded` only after its adapter is stored.

Where it sits: the worker's run supervision (worker/runs.py) calls `succeed` once a run finished
training and the serving-parity check ran; it proves the run's lease like every transition
(jobs/transitions.py), so a run that lost its job registers nothing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import time
from dataclasses import dataclass

import orjson
from sqlalchemy.orm import Session

from catalog.bases import get_base
from jobs import transitions
from jobs.limits import check_model_quota
from jobs.model_names import model_name
from openft.ids import file_id as new_file_id
from openft.limits import ADAPTER_BYTES, MIB
from openft.settings import Settings
from storage import jobs as jobs_repo
from storage import keys
from storage.jobs import add_event
from storage.keys import ADAPTER_FILES
from storage.leases import LeaseLost
from storage.models import Account, File, FineTunedModel, Job
from storage.objects import ObjectStore

RESULTS_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")
# A reinforcement job's rows add its step figures (train/rft.py `metrics`: column -> the event's
# key), then one `train_reward:<grader>` column per grader of a `multi` grader, then the
# validation reward recorded on the checkpoint of that step (empty on steps without one).
REWARD_COLUMNS = {"train_mean_reward": "reward_mean", "train_reward_std": "reward_std", "kl": "kl",
                  "completion_length": "completion_length", "zero_variance_groups": "zero_variance_groups",
                  "grader_failures": "grader_failures"}  # fmt: skip
VALID_REWARD_COLUMN = "valid_mean_reward"
# What a person can do about each reason a model is registered not servable (the parity check's
# codes, train/parity.py; a download-only base has no code).
NOT_SERVABLE_ADVICE = {
    "parity_end_of_turn": "The model has not learned to end its turns yet: run the job again with more epochs "
                          "(n_epochs) or a higher learning_rate_multiplier.",
    "parity_served_mismatch": "The batch engine does not answer as the trained model does: this is the service's "
                              "fault, not your data's; report it with the job id.",
    "parity_merged_mismatch": "The merged weights do not answer as the trained model does: this is the service's "
                              "fault, not your data's; report it with the job id.",
    "parity_check_error": "The check could not run: run the job again.",
    None: "Batches on this base are not offered yet.",
}


class RegistrationError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def check_adapter(store: ObjectStore, prefix: str, method_type: str) -> dict[str, dict]:
    """Digest and size of each adapter file; refuses an adapter over its limit or not a plain LoRA."""
    files = {}
    for name in ADAPTER_FILES:
        data = store.get_bytes(f"{prefix}/{name}")
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    limit = ADAPTER_BYTES[method_type]
    if files["adapter_model.safetensors"]["bytes"] > limit:
        raise RegistrationError(
            "adapter_too_large",
            f"The adapter is {files['adapter_model.safetensors']['bytes'] / MIB:.0f} MiB, over the "
            f"{limit // MIB} MiB limit for this method. Lower lora_rank.",
        )
    config = orjson.loads(store.get_bytes(f"{prefix}/adapter_config.json"))
    plain = (
        config.get("peft_type") == "LORA"
        and not config.get("use_dora")
        and not config.get("modules_to_save")
        and not config.get("rank_pattern")
        and not config.get("alpha_pattern")
    )
    if not plain:
        raise RegistrationError("adapter_invalid", "The trained adapter is not a plain LoRA the model registry accepts.")
    return files


def results_csv(rows: list[dict]) -> bytes:
    """The results file: RESULTS_COLUMNS, and a reinforcement job's reward columns when its rows have them."""
    columns = list(RESULTS_COLUMNS)
    for row in rows:
        columns += [c for c in row if c not in columns]
    if VALID_REWARD_COLUMN in columns:  # last, after the per-grader columns
        columns.append(columns.pop(columns.index(VALID_REWARD_COLUMN)))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return out.getvalue().encode()


def results_rows(session: Session, job_id: str) -> list[dict]:
    """The results CSV's rows: every metrics event with a step and a training loss, oldest first."""
    newest_first, _ = jobs_repo.list_events(session, job_id, limit=100_000, after=None)
    events = list(reversed(newest_first))
    valid_rewards = {e.data["checkpoint"]["step"]: e.data["checkpoint"]["valid_reward"] for e in events
                     if e.data and isinstance(e.data.get("checkpoint"), dict) and "valid_reward" in e.data["checkpoint"]}
    rows = []
    for event in events:
        data = event.data
        if event.type != "metrics" or not data or "step" not in data or "train_loss" not in data:
            continue
        row = {column: data.get(column) for column in RESULTS_COLUMNS}
        if "reward_mean" in data:  # a reinforcement job's step
            row.update({column: data.get(key) for column, key in REWARD_COLUMNS.items()})
            row.update({f"train_reward:{name}": value for name, value in (data.get("grader_rewards") or {}).items()})
            row[VALID_REWARD_COLUMN] = valid_rewards.get(data["step"])
        rows.append(row)
    return rows


def register(session, store: ObjectStore, job: Job, *, method_type: str, adapter_prefix: str, now: int,
             metrics_rows: list[dict], settings: Settings, parity: dict | None = None) -> FineTunedModel:
    """Inside the caller's transaction: store the results file, register the model, update the job.

    `parity` is train/parity.py's outcome (`servable`, `reason`, `parity` figures), None when the
    check did not run (a download-only base, or `parity_check` off). A model that failed it is
    registered not servable with its reason, and `fine_tuned_model` stays null, as for a
    download-only base: the reference keeps it null "until the adapter is servable"."""
    account = session.get(Account, job.account_id)
    files = check_adapter(store, adapter_prefix, method_type)
    over = check_model_quota(session, job, settings)
    if over is not None:
        held, quota = over
        raise RegistrationError(
            "adapter_quota_exceeded",
            f"Your account already holds {held} fine-tuned models (limit {quota}, open jobs reserve one each). "
            "Delete some and run the job again.",
        )
    base = get_base(job.model)
    name = model_name(base.id, account.org_id, job.id)
    servable, reason = base.servable, base.not_servable_reason
    if servable and parity is not None and not parity["servable"]:
        servable, reason = False, parity["reason"]
    model = FineTunedModel(
        id=name, account_id=account.id, job_id=job.id, base=base.id, servable=servable,
        reason=reason, adapter_prefix=adapter_prefix, files=files, created_at=now,
        created_ns=time.time_ns(),
    )
    session.add(model)
    csv_bytes = results_csv(metrics_rows)
    results = File(
        id=new_file_id(), account_id=account.id, filename=f"{job.id}-results.csv", purpose="fine-tune-results",
        bytes=len(csv_bytes), created_at=now, created_ns=time.time_ns(),
        expires_at=now + settings.file_retention_days * 86400,
        status="processed", sha256=hashlib.sha256(csv_bytes).hexdigest(), object_key=keys.results_file(account.id, job.id),
        stats={},
    )
    store.put_bytes(results.object_key, csv_bytes)
    session.add(results)
    job.result_files = [results.id]
    job.fine_tuned_model = name if servable else None
    job.fine_tuned_adapter = {"model": name, "servable": servable, "reason": reason}
    if not servable:
        # Where the user looks: the job's events say it, with what to do, in the registration's transaction.
        code = (parity or {}).get("parity", {}).get("check") if base.servable else None
        add_event(session, job.id, now, f"The adapter is stored and can be downloaded, but the model is not servable, "
                  f"so fine_tuned_model stays null: {reason} {NOT_SERVABLE_ADVICE.get(code, '')}".strip(),
                  level="warn", data={"servable": False, "code": code})
    if parity is not None:
        job.fine_tuned_adapter["parity"] = parity["parity"]
    return model


@dataclass(frozen=True)
class Registered:
    """What the run's metrics record once the success is committed."""

    model: str  # the base
    first_step_s: float | None
    trained_tokens: int | None


def succeed(session: Session, store: ObjectStore, settings: Settings, job_id: str, owner: str, now: int, *,
            result: dict, trained_tokens: int | None, method_type: str, parity: dict | None) -> Registered | None:
    """The success transaction of a job whose run (`owner`) finished training: the result, the
    adapter registered, "Training finished." and `succeeded` (its charge settled), or, when
    registration refuses the adapter (a quota, an invalid adapter), the job failed with that code
    and None. Raises LeaseLost when `owner` no longer holds the job: then nothing is written."""
    job = transitions.owned(session, job_id, owner)
    if job is None:
        raise LeaseLost()
    job.result, job.trained_tokens = result, trained_tokens
    try:
        register(session, store, job, method_type=method_type, adapter_prefix=keys.adapter(job.id).rstrip("/"),
                 now=now, metrics_rows=results_rows(session, job.id), settings=settings, parity=parity)
    except RegistrationError as exc:
        transitions.run_refused(session, job, owner, now, exc.code, exc.message)
        return None
    first_step_s = jobs_repo.first_step_seconds(session, job.id)
    jobs_repo.add_event(session, job.id, now, "Training finished.", type="metrics", data=job.result)
    transitions.run_succeeded(session, job, owner, now)
    return Registered(job.model, first_step_s, job.trained_tokens)
