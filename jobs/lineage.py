"""A job's parent: the `ft:` model or kept checkpoint a new job continues from (issue 26 item 2).

Where it sits: job create (jobs/create.py) calls `find_parent` when `model` names an `ft:` model,
before jobs/params.py parses the rest (the parent fixes the base, the rank and the alpha), and
`copy_parent_adapter` once every check has passed; the run (train/attempt.py) starts the new adapter
from the copy (`TrainJob.init_adapter_prefix`).

Decisions (the issue fixes "same base, same rank, the parent in gridline, another account's model
is 404"; the rest is ours):
- Names resolve through the one resolver (jobs/model_names.py), so a parent is exactly what a batch
  or an eval of the account may run: one of its live `ft:` models or kept checkpoints. Unknown,
  deleted and another account's answer alike, 404 `model_not_found` with param `model`, as batches,
  evals and chat do. A download-only base's model may be a parent: training needs no serving.
- The rank and the alpha are the parent's: left out, they are copied; given and different, the job
  is refused naming the parent's value (a different alpha rescales the adapter, so the new job
  would not start from the parent's function).
- The parent's two adapter files are copied under the new job's run (`keys.parent_adapter`) at
  create, so deleting the parent, or its checkpoint rolling out of the kept three, never breaks a
  job that is still queued; the copy goes with the run's copies when the reaper takes them.
- The job's `model` stays the base id (every layer reads it as the base); the parent's name is in
  `gridline.parent`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from jobs.model_names import resolve_checkpoint, resolve_model
from openft.errors import NotFound
from storage import keys
from storage.models import FineTunedModel, Job
from storage.objects import ObjectStore


@dataclass(frozen=True)
class Parent:
    model: str  # the name the caller gave: an ft: model or `<ft name>:ckpt-step-<N>`
    job_id: str  # the job that trained it
    base_id: str
    lora_rank: int
    lora_alpha: int
    adapter_prefix: str  # its peft-format adapter files (ends "/")

    def record(self) -> dict:
        """What the job stores (`JobSpec.parent`) and shows as `gridline.parent`."""
        return {"model": self.model, "fine_tuning_job_id": self.job_id, "lora_rank": self.lora_rank,
                "lora_alpha": self.lora_alpha}


def names_parent(model: object) -> bool:
    return isinstance(model, str) and model.startswith("ft:")


def find_parent(session: Session, account_id: str, name: str) -> Parent:
    """The account's model `name` as a parent; 404 `model_not_found` for anything else."""
    found = resolve_model(session, account_id, name)
    job = None
    if found is not None and found.kind == "ft":
        job = session.get(Job, session.get(FineTunedModel, name).job_id)
    elif found is not None and found.kind == "checkpoint":
        job = resolve_checkpoint(session, account_id, name)[0]
    if found is None or job is None:
        raise NotFound(
            "model names none of your ft: models or kept checkpoints; name a base, or one of yours "
            "(GET /v1/models, GET /v1/fine_tuning/jobs/{id}/checkpoints).", param="model", code="model_not_found")
    spec = job.spec
    return Parent(model=name, job_id=job.id, base_id=found.base_id, lora_rank=spec["lora_rank"],
                  lora_alpha=spec["lora_alpha"], adapter_prefix=found.adapter_prefix)


def copy_parent_adapter(store: ObjectStore, parent: Parent, job_id: str) -> None:
    """The parent's adapter files under the new job's run, where its runs read them."""
    target = keys.parent_adapter(job_id)
    for name in keys.ADAPTER_FILES:
        store.put_bytes(target + name, store.get_bytes(parent.adapter_prefix + name))
