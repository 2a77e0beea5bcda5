"""Registering a trained adapter as an `ft:` model: size and format checks, the account's model
quota, the model name, the results CSV. A job is `succeeded` only after its adapter is stored."""

from __future__ import annotations

import csv
import hashlib
import io
import time

import orjson

from catalog.bases import get_base
from jobs.limits import check_model_quota
from jobs.model_names import model_name
from openft.ids import file_id as new_file_id
from storage import keys
from storage.models import Account, File, FineTunedModel, Job
from storage.keys import ADAPTER_FILES
from storage.objects import ObjectStore

ADAPTER_LIMIT_BYTES = {"supervised": 383 * 1024 * 1024, "dpo": 128 * 1024 * 1024}
MODEL_QUOTA = 100
RESULTS_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")


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
    limit = ADAPTER_LIMIT_BYTES[method_type]
    if files["adapter_model.safetensors"]["bytes"] > limit:
        raise RegistrationError(
            "adapter_too_large",
            f"The adapter is {files['adapter_model.safetensors']['bytes'] / 2**20:.0f} MiB, over the "
            f"{limit // 2**20} MiB limit for this method. Lower lora_rank.",
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
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RESULTS_COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in RESULTS_COLUMNS])
    return out.getvalue().encode()


def register(session, store: ObjectStore, job: Job, *, method_type: str, adapter_prefix: str, now: int,
             metrics_rows: list[dict], retention_days: int, default_models_limit: int = MODEL_QUOTA,
             parity: dict | None = None) -> FineTunedModel:
    """Inside the caller's transaction: store the results file, register the model, update the job.

    `parity` is train/parity.py's outcome (`servable`, `reason`, `parity` figures), None when the
    check did not run (a download-only base, or `parity_check` off). A model that failed it is
    registered not servable with its reason, and `fine_tuned_model` stays null, as for a
    download-only base: the reference keeps it null "until the adapter is servable"."""
    account = session.get(Account, job.account_id)
    files = check_adapter(store, adapter_prefix, method_type)
    over = check_model_quota(session, job, default_models_limit)
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
        bytes=len(csv_bytes), created_at=now, created_ns=time.time_ns(), expires_at=now + retention_days * 86400,
        status="processed", sha256=hashlib.sha256(csv_bytes).hexdigest(), object_key=keys.results_file(account.id, job.id),
        stats={},
    )
    store.put_bytes(results.object_key, csv_bytes)
    session.add(results)
    job.result_files = [results.id]
    job.fine_tuned_model = name if servable else None
    job.fine_tuned_adapter = {"model": name, "servable": servable, "reason": reason}
    if parity is not None:
        job.fine_tuned_adapter["parity"] = parity["parity"]
    return model
