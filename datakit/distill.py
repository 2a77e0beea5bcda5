"""Distill a batch's results with its requests from a notebook: `pipelines.distill_ray.build_distill`
(the Ray Data job behind `POST /v1/files/distill`) on files where the data team keeps them.

`build_distill` reads and writes one object store, so the results, the requests and the output
directory must share one: one S3 bucket, or one local directory tree (their common parent is the
store's root). The output is `<out>/train.jsonl` and `<out>/eval.jsonl`, the bytes the endpoint
records as its training and validation files for the same inputs and options. Where the endpoint
refuses a distillation that kept no training row (`invalid_file_format`), this returns it with
`train_rows == 0`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray

from datakit.sources import S3, Source, StoredFile, location, resolve
from pipelines.distill import DistillOptions
from pipelines.distill_ray import build_distill

__all__ = ["Distilled", "distill"]


@dataclass(frozen=True)
class Distilled:
    train_path: str
    eval_path: str
    train_rows: int
    eval_rows: int
    dropped: dict[str, int]  # every reason of pipelines.distill.REASONS
    s3: S3

    def datasets(self) -> tuple[ray.data.Dataset, ray.data.Dataset]:
        """(train, eval) as Datasets of their JSONL lines (`text` column)."""
        return _read_lines(self.train_path, self.s3), _read_lines(self.eval_path, self.s3)


def _read_lines(path: str, s3: S3) -> ray.data.Dataset:
    spec, key = location(path, s3)
    data = (StoredFile(spec, key, path).store().get_bytes(key)).decode()
    return ray.data.from_items([{"text": line} for line in data.splitlines()])


def _one(source: Source, what: str, s3: S3 | None, staging: str | None) -> StoredFile:
    files = resolve(source, s3=s3, staging=staging)
    if len(files) != 1:
        raise ValueError(f"{what} names {len(files)} files; pass one")
    return files[0]


def _common_store(files: list[StoredFile], out_spec: tuple, out_key: str, out_path: str) -> tuple[tuple, list[str], str]:
    """One store holding every input and the output, and the keys in it."""
    specs = [f.store_spec for f in files] + [out_spec]
    on_s3 = {s[0].startswith("s3://") for s in specs}
    if len(on_s3) > 1:
        raise ValueError("results, requests and out must be all local or all in one S3 bucket")
    if on_s3 == {True}:
        if len({s[0] for s in specs}) != 1:
            raise ValueError("results, requests and out must be in one S3 bucket (build_distill reads and writes one store)")
        return specs[0], [f.key for f in files], out_key
    out_dir = Path(out_path).expanduser().resolve()
    paths = [Path(f.store().local_path(f.key)) for f in files]
    root = Path(os.path.commonpath([str(p) for p in paths] + [str(out_dir)]))
    if root == out_dir:
        root = out_dir.parent  # the output is a directory-like key under the root
    if root == Path(root.anchor):
        raise ValueError("results, requests and out must share a directory other than the file system's root")
    keys = [str(p.relative_to(root)) for p in paths]
    return (root.as_uri(), None, out_spec[2]), keys, f"{out_dir.relative_to(root)}/train.jsonl"


def distill(results: Source, requests: Source, out: str | os.PathLike | None = None, *,
            require_json: bool = False, keep_truncated: bool = False, eval_fraction: float = 0.1, seed: int = 0,
            s3: S3 | None = None, staging: str | None = None, block_bytes: int = 8 << 20) -> Distilled:
    """OpenAI or Anthropic batch `results` with their `requests` -> `<out>/train.jsonl`, `<out>/eval.jsonl`.

    The options are the endpoint's (`pipelines.distill.DistillOptions`, refused with the same codes);
    a refused file raises `pipelines.distill.DistillError` with its code, param and line. `out`
    defaults to a new local temporary directory (a one-node cluster's); Datasets are staged as in
    `datakit.sources`."""
    options = DistillOptions(require_json=require_json, keep_truncated=keep_truncated, eval_fraction=eval_fraction,
                             seed=seed)
    s3 = s3 or S3()
    files = [_one(results, "results", s3, staging), _one(requests, "requests", s3, staging)]
    out = os.fspath(out) if out is not None else tempfile.mkdtemp(prefix="datakit-distill-")
    out_spec, out_key = location(out.rstrip("/") + "/train.jsonl", s3)
    spec, (results_key, requests_key), train_key = _common_store(files, out_spec, out_key, out)
    prefix = train_key.rpartition("/")[0]
    if not prefix:
        raise ValueError("out must be a directory inside the store, not its root")
    made = build_distill(spec, results_key, requests_key, prefix, options, block_bytes=block_bytes)
    base = out.rstrip("/")
    return Distilled(f"{base}/train.jsonl", f"{base}/eval.jsonl", made.train_rows, made.eval_rows, made.dropped, s3)
