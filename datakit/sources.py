"""Where a notebook's data lives, as the service's own stages see it: an object store and a key.

Every stage of `pipelines/` reads stored objects through `storage.objects` by (store spec, key);
the notebook API hands them the same, so a file in a data team's bucket is read by the very code
that reads an upload. A path is resolved to the store that holds it:
  `s3://bucket/dir/file.jsonl`  -> store `s3://bucket` (endpoint and region from `S3`), key `dir/file.jsonl`
  `/abs/dir/file.jsonl`         -> store `file:///abs/dir`, key `file.jsonl`
Globs (`*`, `?`, `[...]`) name every matching file, each checked as a file of its own, in path order.

A Ray Dataset is written, in its order, as one JSONL file per input file into `staging` (a local
directory by default: good for a one-node cluster; on several nodes pass an `s3://` staging prefix
every node reaches). Its rows are taken as: `bytes` + `path` columns (`ray.data.read_binary_files(...,
include_paths=True)`): each row a whole file, bytes as they are; a `text` column (`ray.data.read_text`,
pass `drop_empty_lines=False` to keep line numbers): one line per row; any other rows: one JSON object
per row (`orjson.dumps` of the row without its null fields: Arrow, under `from_items` and `read_json`,
fills a field a row lacks with null; so a null the row really held is dropped too: read JSONL with
`read_text` to check it as written).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import orjson

from storage.objects import ObjectStore, open_object_store

__all__ = ["S3", "Source", "StoredFile", "resolve", "location"]


@dataclass(frozen=True)
class S3:
    """How to reach S3: an endpoint for MinIO, R2 or SeaweedFS (None: AWS) and the signing region.
    Credentials come from boto3's and pyarrow's usual chain (`AWS_ACCESS_KEY_ID`, ...) on every node."""

    endpoint_url: str | None = None
    region: str = "us-east-1"


@dataclass(frozen=True)
class StoredFile:
    """One input file: the store that holds it, its key there, and the path the user named."""

    store_spec: tuple
    key: str
    path: str

    def store(self) -> ObjectStore:
        return open_object_store(*self.store_spec)


Source = Union[str, os.PathLike, "ray.data.Dataset"]  # noqa: F821
_GLOB = ("*", "?", "[")


def location(path: str | os.PathLike, s3: S3 | None = None) -> tuple[tuple, str]:
    """(store spec, key) of one object path, which need not exist yet (an output)."""
    path = os.fspath(path)
    s3 = s3 or S3()
    if path.startswith("s3://"):
        bucket, _, key = path.removeprefix("s3://").partition("/")
        if not key:
            raise ValueError(f"{path} names a bucket, not an object: s3://bucket/dir/file.jsonl")
        return (f"s3://{bucket}", s3.endpoint_url, s3.region), key
    if "://" in path:
        raise ValueError("a path is local (/dir/file.jsonl) or s3://bucket/key; read other schemes with "
                         "ray.data.read_binary_files(..., include_paths=True) and pass the Dataset")
    full = Path(path).expanduser().resolve()
    return (full.parent.as_uri(), None, s3.region), full.name


def resolve(source: Source, *, s3: S3 | None = None, staging: str | None = None) -> list[StoredFile]:
    """The stored files a source names, in path order (a Dataset is staged first)."""
    if not isinstance(source, (str, os.PathLike)):
        return _stage(source, s3=s3, staging=staging)
    path = os.fspath(source)
    if not any(c in path for c in _GLOB):
        spec, key = location(path, s3)
        return [StoredFile(spec, key, path)]
    if path.startswith("s3://"):
        spec, pattern = location(path, s3)
        literal = pattern[: min(pattern.find(c) for c in _GLOB if c in pattern)]
        store = open_object_store(*spec)
        keys = sorted(k for k in store.list(literal.rpartition("/")[0] + "/" if "/" in literal else "")
                      if fnmatch.fnmatchcase(k, pattern))
        files = [StoredFile(spec, k, f"{spec[0]}/{k}") for k in keys]
    else:
        files = []
        for match in sorted(glob.glob(os.path.expanduser(path))):
            if os.path.isfile(match):
                spec, key = location(match, s3)
                files.append(StoredFile(spec, key, match))
    if not files:
        raise FileNotFoundError(f"no file matches {path}")
    return files


def _stage(ds: Any, *, s3: S3 | None, staging: str | None) -> list[StoredFile]:
    """Write a Dataset's rows, in order, as JSONL objects under `staging` (see the module docstring)."""
    if staging is None:
        staging = tempfile.mkdtemp(prefix="datakit-")
    ds.context.execution_options.preserve_order = True
    columns = set(ds.columns() or ())
    run = uuid.uuid4().hex[:12]
    if {"bytes", "path"} <= columns:
        files = []
        for i, row in enumerate(ds.iter_rows()):
            spec, key = location(f"{staging.rstrip('/')}/{run}/{i:06d}-{Path(row['path']).name}", s3)
            open_object_store(*spec).put_bytes(key, bytes(row["bytes"]))
            files.append(StoredFile(spec, key, row["path"]))
        return files
    spec, key = location(f"{staging.rstrip('/')}/{run}/dataset.jsonl", s3)
    text = columns == {"text"}
    with open_object_store(*spec).writer(key) as w:
        for row in ds.iter_rows():
            line = row["text"] if text else orjson.dumps(_plain(dict(row)))
            w.write((line.encode() if isinstance(line, str) else bytes(line)) + b"\n")
    return [StoredFile(spec, key, "dataset")]


def _plain(value: Any) -> Any:
    """Numpy values from a Dataset as the plain JSON values the row was made of. Arrow gives every
    row every field its schema has, null where the row had none, so null fields are dropped."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
