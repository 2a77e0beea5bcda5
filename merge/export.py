"""What an export carries besides the merged shards, and the read-back check of every stored file.

Last step of the flow (`merge/run.py`): the licence files (the base's own `LICENSE` and, per
licence, `USE_POLICY.md`, each checked against the reviewed digests in
`catalog/licences/reviewed.json`; the catalog's reviewed copy when the base ships none), a
`NOTICE` that says what the merge changed (with the licence's required attribution, and the base's
own NOTICE kept), and `gridline_merge.json`, written last, listing every file's SHA-256 and size.
Everything here is a pure function of the plan and the adapter, so a re-run writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import catalog
from catalog.bases import BaseModelSpec
from merge.adapter import LoraAdapter
from merge.errors import MergeError
from merge.plan import MergePlan
from storage.objects import ObjectNotFound, ObjectStore, aligned_buffer

LICENCE_DIR = Path(catalog.__file__).parent / "licences"
REVIEWED = LICENCE_DIR / "reviewed.json"
MANIFEST = "gridline_merge.json"
NOTICE = "NOTICE"
FORMAT = 1


@dataclass(frozen=True)
class LicenceFile:
    name: str  # in the export: LICENSE, USE_POLICY.md
    catalog_file: Path
    sha256: tuple[str, ...]  # every reviewed text of this file


def reviewed_licence(base: BaseModelSpec) -> tuple[list[LicenceFile], str]:
    """The licence files an export of `base` must carry and the attribution its NOTICE must hold."""
    entry = json.loads(REVIEWED.read_text()).get(base.licence)
    names = ["LICENSE", *base.extra_files]
    if entry is None or not set(names) <= set(entry["files"]):
        raise MergeError(
            "merge_licence_unreviewed",
            f"The {base.licence} licence of {base.id} has not been reviewed for handing out merged copies yet.",
        )
    files = [
        LicenceFile(n, LICENCE_DIR / entry["files"][n]["catalog_file"], tuple(entry["files"][n]["sha256"])) for n in names
    ]
    return files, entry["notice"]


def licence_sources(licences: list[LicenceFile], base_dir: Path, base_files: set[str]) -> dict[str, Path]:
    """Export name -> the file to copy: the base's own where it ships one, else the catalog's;
    either must hold reviewed bytes. The base's own are copied with the base's files."""
    sources = {}
    for lic in licences:
        own = lic.name in base_files
        path = base_dir / lic.name if own else lic.catalog_file
        if hashlib.sha256(path.read_bytes()).hexdigest() not in lic.sha256:
            where = "the base's" if own else "the catalog's"
            raise MergeError("merge_licence_digest", f"{where} {lic.name} is not a reviewed text of the {lic.name} file.")
        if not own:
            sources[lic.name] = path
    return sources


def notice_text(plan: MergePlan, adapter: LoraAdapter, added: list[str], attribution: str, base_notice: str | None) -> str:
    base = plan.base
    lines = [
        f"This is {base.hf_repo} at revision {base.revision} (openft base {base.id}) with a LoRA adapter",
        "merged into its weights.",
        "",
        "What was changed:",
        f"- {len(adapter.factors)} weights were replaced by W + B·A × lora_alpha / r (r = {adapter.r}, "
        f"lora_alpha = {adapter.alpha:g}), computed in fp32 and rounded once to bf16.",
        f"- Modified files: {', '.join(plan.modified)}.",
        "- Every other base file is the base's own, byte for byte; gridline_merge.json lists every file's SHA-256.",
        f"- Added: {', '.join(added)}.",
    ]
    if plan.omitted:
        lines.append(f"- Left out (the base's weights in other formats, which do not carry the merge): {', '.join(plan.omitted)}.")
    extra = "".join(f" and {n}" for n in base.extra_files)
    lines += ["", f"Licence: {base.licence}; see LICENSE{extra}."]
    if attribution:
        lines += ["", attribution]
    if base_notice:
        lines += ["", "The base's own NOTICE follows.", "", base_notice.rstrip("\n")]
    return "\n".join(lines) + "\n"


def manifest(plan: MergePlan, adapter: LoraAdapter, adapter_sha256: dict[str, str], files: list[dict], added: list[str]) -> dict:
    base = plan.base
    return {
        "format": FORMAT,
        "base": base.id,
        "hf_repo": base.hf_repo,
        "revision": base.revision,
        "licence": base.licence,
        "adapter": {
            "sha256": dict(sorted(adapter_sha256.items())),
            "r": adapter.r,
            "lora_alpha": adapter.alpha,
            "scale": adapter.scale,
            "modules": [f.module for f in adapter.factors],
        },
        "modified": plan.modified,
        "added": added,
        "omitted": list(plan.omitted),
        "files": sorted(files, key=lambda f: f["path"]),
    }


def manifest_bytes(doc: dict) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def put_checked(store: ObjectStore, key: str, path: str, data: bytes) -> dict:
    """Store `data` under `key`, read it back, and return its file entry."""
    digest = hashlib.sha256(data).hexdigest()
    store.put_bytes(key, data)
    readback(store, key, len(data), digest)
    return {"path": path, "bytes": len(data), "sha256": digest, "modified": False}


def readback(store: ObjectStore, key: str, size: int, sha256: str, buf: memoryview | None = None) -> None:
    """Read a stored file back (from the device itself on the local backend) and compare it with
    what was written. `buf` (from `aligned_buffer`) is reused across files by the caller."""
    digest, n = hashlib.sha256(), 0
    try:
        for chunk in store.iter_into(key, buf if buf is not None else aligned_buffer()):
            digest.update(chunk)
            n += len(chunk)
    except (ObjectNotFound, OSError) as exc:
        raise MergeError("merge_readback_unavailable", f"The stored {key.rsplit('/', 1)[-1]} could not be read back.") from exc
    if n != size or digest.hexdigest() != sha256:
        raise MergeError(
            "merge_readback_mismatch",
            f"The stored {key.rsplit('/', 1)[-1]} did not match what was written, so the export was deleted.",
        )
