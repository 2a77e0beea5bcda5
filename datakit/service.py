"""From a notebook to the service through the official openai SDK: upload a file with a progress bar
(tqdm.auto: a widget in Jupyter, text elsewhere), create a fine-tuning job and follow its events.

The SDK hands an open file to httpx, which streams the multipart body by reading it in chunks:
the bar advances with each chunk read, so it shows what went onto the wire.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from typing import Any, Callable

from tqdm.auto import tqdm

from datakit.sources import S3, location
from storage.objects import open_object_store

__all__ = ["ENDED", "follow", "fine_tune", "job_events", "upload"]

ENDED = ("succeeded", "failed", "cancelled")


class _Progress(io.RawIOBase):
    """A binary file whose reads advance a tqdm bar."""

    def __init__(self, f, bar):
        self.f, self.bar = f, bar

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.bar.update(len(data))
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


def upload(client, data: str | os.PathLike | bytes, purpose: str = "fine-tune", *, filename: str | None = None,
           s3: S3 | None = None, progress: bool = True):
    """Upload a local path, an `s3://` object or bytes as a file (`client.files.create`); returns the
    FileObject. A refusal raises the SDK's `openai.BadRequestError` with the service's code."""
    with tempfile.TemporaryFile() as spool:
        if isinstance(data, bytes):
            spool.write(data)
            name = filename or "data.jsonl"
        elif os.fspath(data).startswith("s3://"):
            spec, key = location(data, s3)
            for chunk in open_object_store(*spec).iter_chunks(key):
                spool.write(chunk)
            name = filename or key.rpartition("/")[2]
        else:
            with open(os.fspath(data), "rb") as f:
                while chunk := f.read(1 << 20):
                    spool.write(chunk)
            name = filename or os.path.basename(os.fspath(data))
        size = spool.tell()
        spool.seek(0)
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"upload {name}", disable=not progress) as bar:
            return client.files.create(file=(name, _Progress(spool, bar)), purpose=purpose)


def fine_tune(client, training_file: str, model: str, *, validation_file: str | None = None,
              hyperparameters: dict[str, Any] | None = None, follow_events: bool = True, **create: Any):
    """`client.fine_tuning.jobs.create` with a supervised LoRA method, then (by default) `follow` it."""
    method = {"type": "supervised", "supervised": {"hyperparameters": hyperparameters or {}}}
    job = client.fine_tuning.jobs.create(model=model, training_file=training_file, validation_file=validation_file,
                                         method=method, **create)
    return follow(client, job.id) if follow_events else job


def follow(client, job_id: str, *, poll_seconds: float = 2.0, timeout_seconds: float | None = None,
           printer: Callable[[str], None] = print):
    """Print the job's events as they come (oldest first) until it ends; returns the ended job."""
    seen: set[str] = set()
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        page = client.fine_tuning.jobs.list_events(job_id, limit=100).data  # newest first
        for event in [e for e in reversed(page) if e.id not in seen]:
            seen.add(event.id)
            if event.type != "metrics":
                printer(f"{event.level:5} {event.message}")
        if job.status in ENDED:
            return job
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{job_id} is still {job.status} after {timeout_seconds} s")
        time.sleep(poll_seconds)


def job_events(client, job_id: str) -> list:
    """Every event of the job, oldest first (the SDK pages through them, newest first)."""
    return list(reversed(list(client.fine_tuning.jobs.list_events(job_id, limit=100))))
