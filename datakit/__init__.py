"""The notebook API: the service's own data stages, run on a data team's Ray cluster over their files.

    import ray, datakit as dk
    ray.init(address="ray://head:10001")
    bad = dk.validate("s3://team/batch/*.jsonl", s3=dk.S3("https://minio:9000"))   # every bad line, with its code
    dk.estimate_tokens("train.jsonl")                     # per base, the counts the quote uses
    dk.render("train.jsonl", "qwen2.5-7b-instruct")        # the template's text, or job create's refusal
    out = dk.distill("s3://team/out.jsonl", "s3://team/in.jsonl", "s3://team/distilled", s3=...)
    f = dk.upload(client, out.train_path, s3=...); job = dk.fine_tune(client, f.id, "qwen2.5-7b-instruct")

The top floor: it imports pipelines/, catalog/, storage/ and openft/, and nothing imports it.
"""

from datakit.distill import Distilled, distill
from datakit.rows import BadLine, FileReport, check_files, estimate_tokens, render, validate
from datakit.service import ENDED, fine_tune, follow, job_events, upload
from datakit.sources import S3, location, resolve

__all__ = [
    "ENDED", "S3", "BadLine", "Distilled", "FileReport", "check_files", "distill", "estimate_tokens", "fine_tune",
    "follow", "job_events", "location", "render", "resolve", "upload", "validate", "write_jsonl",
]


def write_jsonl(ds, path: str, *, s3: S3 | None = None) -> str:
    """Write a Dataset's rows (as returned by validate / render) to one JSONL object at `path`, in order."""
    import orjson

    from storage.objects import open_object_store

    spec, key = location(path, s3)
    ds.context.execution_options.preserve_order = True
    with open_object_store(*spec).writer(key) as w:
        for row in ds.iter_rows():
            w.write(orjson.dumps(dict(row)) + b"\n")
    return path
