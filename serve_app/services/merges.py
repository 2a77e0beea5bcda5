"""Merged weights: start a merge of an `ft:` model, read its status, download its files, delete it.

A `POST` runs the merge engine's preflight (adapter config and safetensors header only): the four
refusals of the reference's first table answer `400 invalid_request` and record nothing; any other
problem found there is recorded at once as a `failed` merge with its code; otherwise the merge is
recorded `queued` and the worker runs it under a lease (merge/worker.py). A `POST` while the
model's merge is queued, running or succeeded answers that merge unchanged (the merge is a pure
function of the adapter, so there is nothing new to make); after a failure or expiry it merges again.

Limits (merge/quota.py), checked under the account's row lock: one merge queued or running per
account and 10 accepted a UTC day answer `429 limit_exceeded` with `error.limit` (they clear by
waiting, like the open-jobs limit); holding 4 exports or 64 GB answers `429 merge_weights_quota`
(it clears by deleting one). A merge that would pass 64 GB once its size is known fails with the
same code.

Downloads redirect to the stored object: an S3 presigned URL, or on the local backend a URL of this
app (`/v1/gridline/blobs/{token}`) whose token is the encrypted, authenticated `{key, sha256, size,
name, expiry}` (serve_app/services/blob_tokens.py): it shows nothing of the account or the object.
That route takes no bearer key: the token is the credential, as with a presigned URL, so download
tools that drop `Authorization` on redirects work the same on both backends.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

from merge import quota
from merge.errors import MergeError
from merge.run import preflight
from merge.worker import merge_request, purge_exports
from openft.errors import InvalidRequest, NotFound
from openft.ids import new_id
from serve_app.downloads import ByteRange, open_object
from serve_app.schemas.merges import MergedFile, MergedWeights, MergedWeightsDeleted, MergeErrorInfo
from serve_app.services.blob_tokens import Blob, seal, unseal
from serve_app.services.models import get_ft_model
from serve_app.state import AppState
from storage import keys
from storage import merges as repo
from storage.leases import lock_account
from storage.models import Account, Merge
from storage.objects import ObjectNotFound

URL_TTL_S = 300


def _status(row: Merge, now: int) -> str:
    """`expired` from the moment an export's 7 days end, before the worker has deleted it."""
    if row.status == "succeeded" and row.expires_at is not None and row.expires_at <= now:
        return "expired"
    return row.status


def _object(row: Merge, now: int) -> MergedWeights:
    status = _status(row, now)
    files = [MergedFile(path=f["path"], bytes=f["bytes"], sha256=f["sha256"]) for f in row.files] if status == "succeeded" else []
    error = MergeErrorInfo(**row.error) if status == "failed" and row.error else None
    return MergedWeights(model=row.model, status=status, created_at=row.created_at, finished_at=row.finished_at,
                         expires_at=row.expires_at, files=files, error=error)  # fmt: skip


def _no_merge() -> NotFound:
    return NotFound("This model has no merged weights; POST .../merged to start a merge.", param="model")


def _current(session, account_id: str, model: str, now: int) -> Merge | None:
    """The model's merge a POST answers with instead of merging again: queued, running or succeeded."""
    latest = repo.latest_merge(session, account_id, model)
    return latest if latest is not None and _status(latest, now) in ("queued", "running", "succeeded") else None


def start_merge(state: AppState, account: Account, model: str) -> MergedWeights:
    now = state.now()
    with state.db.session() as session:
        ft = get_ft_model(session, account, model)
        current = _current(session, account.id, model, now)
        if current is not None:
            return _object(current, now)
        adapter_prefix = ft.adapter_prefix
        merge_id = new_id("merge-", 24)
        draft = Merge(
            id=merge_id, account_id=account.id, model=model, base=ft.base, status="queued",
            export_prefix=keys.merge_export(account.id, merge_id), attempts=0, files=[], bytes=0, delete_requested=False,
            adapter_sha256={name: info["sha256"] for name, info in ft.files.items()}, created_at=now,
            created_ns=time.time_ns(),
        )
    try:
        preflight(merge_request(state.settings, state.store, draft, adapter_prefix), state.store)
    except MergeError as exc:
        if exc.refusal:
            raise InvalidRequest(f"This adapter cannot be merged ({exc.code}). {exc.message}",
                                 code="invalid_request", param="model") from None  # fmt: skip
        draft.status, draft.finished_at, draft.error = "failed", now, {"code": exc.code, "message": exc.message}
    with state.db.session() as session:
        lock_account(session, account.id)
        current = _current(session, account.id, model, now)  # a concurrent POST of the same model
        if current is not None:
            return _object(current, now)
        quota.check_admission(session, account.id, now)
        session.add(draft)
        return _object(draft, now)


def get_merged(state: AppState, account: Account, model: str) -> MergedWeights:
    now = state.now()
    with state.db.session() as session:
        get_ft_model(session, account, model)
        row = repo.latest_merge(session, account.id, model)
        if row is None:
            raise _no_merge()
        return _object(row, now)


def delete_merged(state: AppState, account: Account, model: str) -> MergedWeightsDeleted:
    now = state.now()
    with state.db.session() as session:
        get_ft_model(session, account, model)
        rows = repo.visible_merges(session, account.id, model)
        if not rows:
            raise _no_merge()
        if rows[0].status == "running":
            rows[0].delete_requested = True  # the worker deletes what it wrote when the merge ends
            return MergedWeightsDeleted(model=model, deleted=False)
        for row in rows:
            row.deleted_at = now
        owed = [(row.id, row.export_prefix) for row in rows if row.status == "succeeded"]
    purge_exports(state.db, state.store, owed, now)
    return MergedWeightsDeleted(model=model, deleted=True)


def merged_file_url(state: AppState, account: Account, model: str, path: str,
                    blob_url: Callable[[str], str]) -> tuple[str, str]:  # fmt: skip
    """(redirect URL, sha256) of one file of the model's export; `blob_url(token)` is this app's
    download URL for a token, used where the store cannot presign."""
    now = state.now()
    with state.db.session() as session:
        get_ft_model(session, account, model)
        row = repo.latest_merge(session, account.id, model)
        if row is None or _status(row, now) != "succeeded":
            raise NotFound("This model has no export to download; GET .../merged for its status.", param="model")
        entry = next((f for f in row.files if f["path"] == path), None)
        if entry is None:
            raise NotFound("The export has no such file; GET .../merged lists its files.", param="path")
        key = f"{row.export_prefix}/{path}"
    name = path.rsplit("/", 1)[-1]
    url = state.store.presigned_get_url(key, URL_TTL_S, headers={"Content-Disposition": f'attachment; filename="{name}"'})
    if url is None:
        blob = Blob(key=key, sha256=entry["sha256"], size=entry["bytes"], name=name, expires=now + URL_TTL_S)
        url = blob_url(seal(state.settings.resolved_signing_secret(), blob))
    return url, entry["sha256"]


def open_blob(state: AppState, token: str, ranged: ByteRange | None = None) -> tuple[Blob, Iterator[bytes]]:
    """The blob a download token grants and its chunks (the `ranged` span only, when there is one);
    404 for a bad or expired link."""
    blob = unseal(state.settings.resolved_signing_secret(), token)
    if blob is None or blob.expires <= state.now():
        raise NotFound("This download link is not valid or has expired; request the file through .../merged/files/ again.")
    try:
        return blob, open_object(state.store, blob.key, blob.size, ranged)
    except ObjectNotFound:
        raise NotFound("The file is no longer stored: its export was deleted or expired.") from None
