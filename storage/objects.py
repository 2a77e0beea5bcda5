"""The object store: where uploaded files, tokenized datasets, checkpoints and adapters live.

`open_object_store(settings.resolved_storage_url(), ...)` gives a store for `file:///abs/dir`
(a local directory) or `s3://bucket/prefix` (any S3-compatible service). Everything above this
layer (API, pipelines, training, merge) speaks only the `ObjectStore` protocol. A store is
picklable, and `spec()` gives the arguments that reopen it, so Ray tasks can take either.
"""

from __future__ import annotations

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
    "pread_full",
    "check_key",
    "check_prefix",
    "open_object_store",
]


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
    parsed = urlparse(storage_url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError("a file:// storage URL names a local directory: file:///abs/dir (three slashes)")
        return LocalObjectStore(Path(unquote(parsed.path)), storage_url)
    if parsed.scheme == "s3":
        return S3ObjectStore(storage_url, s3_endpoint_url, s3_region, part_size)
    raise ValueError("storage URL must start with file:// (a local directory) or s3:// (a bucket)")
