"""Models: the base catalog plus the caller's own `ft:` models and their jobs' kept checkpoints
(`<ft name>:ckpt-step-<N>`, resolved by jobs/model_names.py); adapter downloads; deletion.

Checkpoints are models you can retrieve, download and name in a batch, but GET /v1/models does not
list them: OpenAI's types and docs do not say that its list carries them, the job's checkpoints
endpoint already lists them, and a list of up to 100 models would otherwise triple."""

from __future__ import annotations

import logging
from typing import Iterator

import orjson

from catalog.bases import BASES
from jobs.model_names import KeptCheckpoint, live_model, live_models, resolve_checkpoint, resolve_model
from merge.worker import purge_exports
from openft.errors import InvalidRequest, NotFound
from serve_app.downloads import ByteRange, open_object
from serve_app.schemas.common import Page
from serve_app.schemas.models import Model, ModelDeleted
from serve_app.state import AppState
from storage import keys
from storage import merges as merges_repo
from storage.keys import ADAPTER_FILES
from storage.models import Account, FineTunedModel, Job
from storage.objects import ObjectNotFound

log = logging.getLogger("openft.api")
_CHECKPOINT_MARK = ":ckpt-step-"


def _base_object(base_id: str) -> Model:
    base = BASES[base_id]
    return Model(id=base.id, created=base.created, owned_by="openft", gridline={
        "hf_repo": base.hf_repo, "revision": base.revision, "licence": base.licence, "servable": base.servable,
    })


def _ft_object(row: FineTunedModel, account: Account) -> Model:
    return Model(id=row.id, created=row.created_at, owned_by=account.org_id, gridline={
        "base": row.base, "job": row.job_id, "servable": row.servable, "reason": row.reason,
    })


def _checkpoint_object(state: AppState, session, account: Account, model: str) -> Model:
    job, ckpt = get_checkpoint(session, account, model)
    _checkpoint_files(state, ckpt)  # kept by the database's rule and actually stored
    resolved = resolve_model(session, account.id, model)
    return Model(id=model, created=ckpt.event.created_at, owned_by=account.org_id, gridline={
        "base": job.model, "job": job.id, "step": ckpt.step, "servable": resolved.servable, "reason": resolved.reason,
    })


def get_checkpoint(session, account: Account, model: str) -> tuple[Job, KeptCheckpoint]:
    found = resolve_checkpoint(session, account.id, model)
    if found is None:
        raise NotFound("No such model.", param="model")
    return found


def _checkpoint_files(state: AppState, ckpt: KeptCheckpoint) -> dict[str, dict]:
    """A checkpoint's adapter files (name -> sha256, bytes), from its meta.json (train/checkpoint.py);
    404 when the store no longer holds it, or it predates peft-format checkpoints."""
    try:
        files = orjson.loads(state.store.get_bytes(ckpt.adapter_prefix + keys.CHECKPOINT_META)).get("files")
    except ObjectNotFound:
        files = None
    if not isinstance(files, dict) or set(files) != set(ADAPTER_FILES):
        raise NotFound("No such model.", param="model")
    return files


def get_ft_model(session, account: Account, model: str) -> FineTunedModel:
    row = live_model(session, account.id, model)
    if row is None:
        raise NotFound("No such model.", param="model")
    return row


def list_models(state: AppState, account: Account) -> Page[Model]:
    with state.db.session() as session:
        data = [_base_object(b) for b in BASES] + [_ft_object(r, account) for r in live_models(session, account.id)]
    return Page[Model](data=data, has_more=False)


def retrieve_model(state: AppState, account: Account, model: str) -> Model:
    if model in BASES:
        return _base_object(model)
    with state.db.session() as session:
        if _CHECKPOINT_MARK in model:  # never part of an ft: name (jobs/model_names.py model_name)
            return _checkpoint_object(state, session, account, model)
        return _ft_object(get_ft_model(session, account, model), account)


def delete_model(state: AppState, account: Account, model: str) -> ModelDeleted:
    if model in BASES:
        raise InvalidRequest("Base models cannot be deleted; only your ft: models.", code="invalid_request", param="model")
    with state.db.session() as session:
        if resolve_checkpoint(session, account.id, model) is not None:
            raise InvalidRequest(
                "A checkpoint cannot be deleted by itself; delete its ft: model, which deletes its checkpoints too.",
                code="invalid_request", param="model",
            )
        row = get_ft_model(session, account, model)
        now = row.deleted_at = state.now()  # unreachable through the API from here on, whatever storage does
        prefix, job_id = row.adapter_prefix, row.job_id
        owed = merges_repo.delete_model_merges(session, account.id, model, now)
    try:
        for name in ADAPTER_FILES:
            state.store.delete(f"{prefix}/{name}")
        state.store.delete_prefix(keys.checkpoints(job_id))  # its checkpoints were models too (and unreachable now)
    except Exception as exc:  # recorded, then the deletion stands: the files are already unreachable
        log.error("adapter delete failed for a deleted model: %s", type(exc).__name__)
        with state.db.session() as session:
            session.get(FineTunedModel, model).delete_error = type(exc).__name__
    purge_exports(state.db, state.store, owed, now)
    return ModelDeleted(id=model, deleted=True)


def adapter_file(state: AppState, account: Account, model: str, name: str,
                 ranged: ByteRange | None = None) -> tuple[str, int, Iterator[bytes]]:  # fmt: skip
    """(sha256, size, chunks) of one adapter file of the caller's model; `chunks` holds the `ranged`
    span only, when there is one."""
    if name not in ADAPTER_FILES:
        raise NotFound("An adapter has two files: adapter_model.safetensors and adapter_config.json.", param="path")
    with state.db.session() as session:
        if _CHECKPOINT_MARK in model:
            _, ckpt = get_checkpoint(session, account, model)
            info, key = _checkpoint_files(state, ckpt)[name], ckpt.adapter_prefix + name
        else:
            row = get_ft_model(session, account, model)
            info, key = row.files[name], f"{row.adapter_prefix}/{name}"
    try:
        chunks = open_object(state.store, key, info["bytes"], ranged)
    except ObjectNotFound:
        raise NotFound("The adapter's files are not available.", param="model") from None
    return info["sha256"], info["bytes"], chunks
