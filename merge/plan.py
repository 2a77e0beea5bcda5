"""The merge plan: which base files the export holds, which shards change, and where each adapted
weight sits, built from the base's pinned digests, its index and its shard headers (no weights read).

Second step of the flow (after `merge/adapter.py`, before the shard tasks of `merge/shard.py`).

Pinned digests, which every base file's bytes are checked against while they are copied:
- stand-in bases record their own in `openft_standin.json` (catalog/standins.py);
- a real base uses `BaseModelSpec.file_sha256` from the catalog when it is filled in, and otherwise
  an operator-pinned file `<cache_root>/pinned/<base id>@<revision>.json` holding
  `{"base": ..., "revision": ..., "files": {"<path>": "<sha256>", ...}}` (the hub's file listing at
  the pinned commit gives the LFS files' SHA-256). With neither, the merge refuses with
  `merge_base_digest`: an unchecked base is never handed out.
The export's base files are exactly the pinned ones; weights in other formats (a `consolidated`
checkpoint, `.bin`/`.pth` files, `original/`) would not carry the merge, so they are left out and
listed as omitted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from catalog.bases import BaseModelSpec
from catalog.model_source import ModelSource
from merge._header import Entry, Header, HeaderError, file_reader, read_header
from merge.adapter import LoraAdapter
from merge.errors import MergeError
from storage.objects import check_key

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PINNED_DIR = "pinned"
_OTHER_WEIGHTS = (".bin", ".pth", ".pt", ".ckpt", ".gguf", ".h5", ".msgpack", ".safetensors")


@dataclass(frozen=True)
class Target:
    """One adapted base weight inside a shard: bytes [start, end) of the shard file."""

    tensor: str
    start: int
    end: int
    shape: tuple[int, int]  # (out, in)
    a: Entry  # offsets into the adapter file
    b: Entry


@dataclass(frozen=True)
class ShardJob:
    path: str  # relative to the base directory and to the export prefix
    sha256: str  # pinned
    size: int
    data_start: int  # where the tensors' bytes begin (after the 8-byte length and the JSON header)
    header_sha256: str
    targets: tuple[Target, ...]  # in file order


@dataclass(frozen=True)
class MergePlan:
    base: BaseModelSpec
    shards: tuple[ShardJob, ...]
    files: tuple[tuple[str, str], ...]  # other base files, copied byte for byte: (path, pinned sha256)
    omitted: tuple[str, ...]

    @property
    def modified(self) -> list[str]:
        return [s.path for s in self.shards if s.targets]


def pinned_path(base: BaseModelSpec, cache_root: Path) -> Path:
    return cache_root / PINNED_DIR / f"{base.id}@{base.revision}.json"


def pinned_digests(base: BaseModelSpec, source: ModelSource, base_dir: Path, cache_root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file of the base at its pinned revision."""
    if source.kind == "standin":
        # Here, not at the top: catalog.standins imports torch and transformers, which the API process
        # that imports this module (to plan merges) never needs (catalog/model_source.py).
        from catalog.standins import MANIFEST, read_manifest

        pinned = read_manifest(base_dir) if (base_dir / MANIFEST).is_file() else None
    elif base.file_sha256:
        return dict(base.file_sha256)
    else:
        path = pinned_path(base, cache_root)
        pinned = json.loads(path.read_text()) if path.is_file() else None
    if pinned is None:
        raise MergeError(
            "merge_base_digest",
            f"No SHA-256 digests are pinned for {base.id} at revision {base.revision}, so its files cannot be "
            "checked; the operator must pin them before this base can be merged.",
        )
    if pinned.get("base") != base.id or pinned.get("revision") != base.revision or not isinstance(pinned.get("files"), dict):
        raise MergeError("merge_base_digest", f"The pinned digests on file are not those of {base.id} at {base.revision}.")
    return pinned["files"]


def build_plan(adapter: LoraAdapter, base_dir: Path, pinned: dict[str, str]) -> MergePlan:
    base = adapter.base
    for path in pinned:
        try:
            check_key(path)
        except ValueError:
            raise MergeError("merge_base_path", f"The base file name {path[:200]!r} was refused.") from None
        if not (base_dir / path).is_file():
            raise MergeError("merge_base_unavailable", f"The base file {path} of {base.id} is missing.")
    weight_map = _weight_map(base_dir, pinned)
    shard_names = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE]
    for name in shard_names:
        if name not in pinned:
            raise MergeError("merge_base_digest", f"The base shard {name} has no pinned SHA-256.")
    adapted = {f.base_tensor for f in adapter.factors}
    headers = {name: _shard_header(base_dir / name, name, adapted) for name in shard_names}
    located = _locate(headers, weight_map)
    targets: dict[str, list[Target]] = {name: [] for name in shard_names}
    for factor in adapter.factors:
        if factor.base_tensor not in located:
            raise MergeError("merge_base_tensor_missing", f"The adapted module {factor.module} has no weight in {base.id}.")
        shard, entry = located[factor.base_tensor]
        if entry.dtype != "BF16":
            raise MergeError("merge_base_dtype", f"The base weight {entry.name} is {entry.dtype}, not BF16.")
        if len(entry.shape) != 2 or factor.a.shape[1] != entry.shape[1] or factor.b.shape[0] != entry.shape[0]:
            raise MergeError(
                "merge_adapter_shape",
                f"module {factor.module}: lora_B @ lora_A is [{factor.b.shape[0]}, {factor.a.shape[1]}] but the base "
                f"weight is {list(entry.shape)}.",
            )
        targets[shard].append(Target(entry.name, entry.start, entry.end, entry.shape, factor.a, factor.b))
    shards = tuple(
        ShardJob(
            path=name,
            sha256=pinned[name],
            size=headers[name].size,
            data_start=headers[name].data_start,
            header_sha256=hashlib.sha256(headers[name].prefix).hexdigest(),
            targets=tuple(sorted(targets[name], key=lambda t: t.start)),
        )
        for name in shard_names
    )
    others = sorted(p for p in pinned if p not in headers)
    omitted = tuple(p for p in others if _other_weights(p))
    files = tuple((p, pinned[p]) for p in others if p not in omitted)
    return MergePlan(base=base, shards=shards, files=files, omitted=omitted)


def _weight_map(base_dir: Path, pinned: dict[str, str]) -> dict[str, str] | None:
    if INDEX not in pinned:
        if SINGLE not in pinned:
            raise MergeError("merge_base_header", f"The base has neither {INDEX} nor {SINGLE}.")
        return None
    try:
        weight_map = json.loads((base_dir / INDEX).read_bytes())["weight_map"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise MergeError("merge_base_header", f"{INDEX} has no readable weight_map.") from None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise MergeError("merge_base_header", f"{INDEX}'s weight_map is not a map of tensor names to shard files.")
    return weight_map


def _shard_header(path: Path, name: str, adapted: set[str]) -> Header:
    try:
        return read_header(file_reader(path), path.stat().st_size)
    except HeaderError as exc:
        if exc.overlap and set(exc.overlap) <= adapted:
            raise MergeError("merge_target_tensor", f"Two adapted base weights overlap in {name}.") from None
        raise MergeError("merge_base_header", f"The base shard {name}: {exc}.") from None


def _locate(headers: dict[str, Header], weight_map: dict[str, str] | None) -> dict[str, tuple[str, Entry]]:
    located: dict[str, tuple[str, Entry]] = {}
    for shard, header in headers.items():
        for entry in header.entries:
            if entry.name in located:
                raise MergeError(
                    "merge_base_tensor_duplicate",
                    f"The base weight {entry.name} appears in both {located[entry.name][0]} and {shard}.",
                )
            located[entry.name] = (shard, entry)
    if weight_map is not None and {k: s for k, (s, _) in located.items()} != weight_map:
        raise MergeError("merge_base_header", f"{INDEX}'s weight_map does not match the shards' headers.")
    return located


def _other_weights(path: str) -> bool:
    return path.startswith("original/") or path.endswith(_OTHER_WEIGHTS)
