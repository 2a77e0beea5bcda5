"""The object store: where uploaded files, tokenized datasets, checkpoints and adapters live.

`open_object_store(settings.resolved_storage_url(), ...)` gives a store for `file:///abs/dir`
(a local directory) or `s3://bucket/prefix` (any S3-compatible service). Everything above this
layer (API, pipelines, training, merge) speaks only the `ObjectStore` protocol. A store is
picklable, and `spec()` gives the arguments that reopen it, so Ray tasks can take either.
"""

from __future__ import annotations

import re
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Iterator, Protocol
from urllib.parse import unquote, urlparse

from storage._keys import ObjectNotFound, check_key, check_prefix
from storage._local import LocalObjectStore, aligned_buffer, pread_full
from storage._s3 import DEFAULT_PART_SIZE, MIN_PART_SIZE, S3ObjectStore

__all__ = [
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "LocalObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "S3ObjectStore",
    "Writer",
    "aligned_buffer",
    "check_storage_url",
    "probe_writable",
    "pread_full",
    "check_key",
    "check_prefix",
    "open_object_store",
]

# S3's bucket naming rules, loosely: enough to refuse `s3:/bucket`, `s3://` and `s3://user@host`.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
PROBE_PREFIX = "openft-probe"


class Writer(Protocol):
    bytes_written: int

    def write(self, b: bytes) -> None:
        """Take a copy of `b` (or write it out) before returning: callers reuse their buffers."""


class ObjectStore(Protocol):
    """Keys are relative POSIX paths (`files/acct/file-abc`); a bad key raises ValueError."""

    url: str

    def spec(self) -> tuple[str, str | None, str]:
        """`(storage_url, s3_endpoint_url, s3_region)`: `open_object_store(*spec)` reopens the store."""
        ...

    def writer(self, key: str) -> AbstractContextManager[Writer]:
        """The object appears only when the block exits cleanly; if it raises, nothing is left behind."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Chunks of at most `chunk_size` bytes; ObjectNotFound is raised at the call, not at iteration."""
        ...

    def iter_into(self, key: str, buf: memoryview) -> Iterator[memoryview]:
        """The object read into `buf` (from `aligned_buffer`), chunk by chunk, each view valid until
        the next; the local backend reads past the page cache, so a read-back sees what the device
        holds. ObjectNotFound is raised at the call, not at iteration."""
        ...

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end), cut short at the object's end, as slicing would."""
        ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Idempotent: deleting a missing key is not an error."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` (non-empty) and return how many there were."""
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with `prefix` (a plain string prefix, "" for all), sorted."""
        ...

    def presigned_get_url(self, key: str, expires_s: int, headers: dict[str, str] | None = None) -> str | None:
        """A URL anyone can GET for `expires_s` seconds, with `headers` (Content-Disposition,
        Content-Type, ...) set on the response; None on the local backend, where the app signs its own."""
        ...

    def presigned_put_url(self, key: str, expires_s: int) -> str | None: ...

    def local_path(self, key: str) -> Path | None:
        """The object's real file (for memory-mapped reads) on the local backend; None on S3."""
        ...


def open_object_store(
    storage_url: str,
    s3_endpoint_url: str | None = None,
    s3_region: str = "us-east-1",
    *,
    part_size: int = DEFAULT_PART_SIZE,
) -> ObjectStore:
    """Open `file:///abs/dir` or `s3://bucket[/prefix]`; S3 credentials come from boto3's usual chain.

    `part_size` is the S3 writer's buffer and multipart part size (at least 5 MiB).
    """
    if check_storage_url(storage_url) == "file":
        return LocalObjectStore(Path(unquote(urlparse(storage_url).path)), storage_url)
    return S3ObjectStore(storage_url, s3_endpoint_url, s3_region, part_size)


def check_storage_url(storage_url: str) -> str:
    """The scheme ("file" or "s3") of a well-formed storage URL; anything else raises ValueError
    saying what to write. `urlparse` alone accepts `s3:/bucket` and `file:relative`, which then
    name the wrong place, so the `//` and the absolute path are checked here."""
    scheme, sep, rest = storage_url.partition("://")
    if scheme == "file" and sep:
        host, _, path = rest.partition("/")
        if host not in ("", "localhost"):
            raise ValueError("a file:// storage URL names a local directory: file:///abs/dir (three slashes)")
        if not path.strip("/"):
            raise ValueError("a file:// storage URL names an absolute directory: file:///abs/dir")
        return "file"
    if scheme == "s3" and sep:
        bucket = rest.partition("/")[0]
        if not _BUCKET.fullmatch(bucket):
            raise ValueError(
                "an S3 storage URL names its bucket (3-63 characters: a-z, 0-9, '.', '-'): s3://bucket or s3://bucket/prefix"
            )
        return "s3"
    raise ValueError("storage URL must start with file:/// (a local directory) or s3:// (a bucket)")


def probe_writable(store: ObjectStore) -> None:
    """Write, read back and delete a small probe object: raises the backend's own error (OSError,
    botocore's) when the directory is read-only, the bucket is missing or the credentials are refused."""
    key = f"{PROBE_PREFIX}/{uuid.uuid4().hex}"
    store.put_bytes(key, b"openft probe")
    try:
        if store.get_bytes(key) != b"openft probe":
            raise OSError(f"the object store returned other bytes than were written under {key}")
    finally:
        store.delete(key)
