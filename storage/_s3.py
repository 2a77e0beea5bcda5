"""The S3 object store (AWS, R2, MinIO, SeaweedFS) through boto3; every key lives under one prefix.

Writes buffer one part in memory: a small object is a single PutObject, a large one a multipart
upload that is completed when the writer's block exits cleanly and aborted when it raises, so an
object is either wholly visible or not at all. Downloads can be handed to clients as presigned URLs.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from storage._keys import ObjectNotFound, check_key, check_prefix, check_range

# S3 (and SeaweedFS) refuse multipart parts below 5 MiB, except the last one.
MIN_PART_SIZE = 5 << 20
DEFAULT_PART_SIZE = 8 << 20
_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys per request

# Response headers a presigned GET may override, mapped to get_object's parameters.
_RESPONSE_OVERRIDES = {
    "cache-control": "ResponseCacheControl",
    "content-disposition": "ResponseContentDisposition",
    "content-encoding": "ResponseContentEncoding",
    "content-language": "ResponseContentLanguage",
    "content-type": "ResponseContentType",
    "expires": "ResponseExpires",
}


def _is_not_found(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in _NOT_FOUND_CODES


class _PartWriter:
    """Buffers writes and ships each full part; the store's `writer` decides commit or abort."""

    def __init__(self, client: Any, bucket: str, name: str, part_size: int):
        self._client, self._bucket, self._name, self._part_size = client, bucket, name, part_size
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self.bytes_written = 0

    def write(self, b: bytes) -> None:
        self._buf += b
        self.bytes_written += len(b)
        while len(self._buf) >= self._part_size:
            self._ship(bytes(self._buf[: self._part_size]))
            del self._buf[: self._part_size]

    def _ship(self, part: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name)["UploadId"]
        number = len(self._parts) + 1
        resp = self._client.upload_part(
            Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, PartNumber=number, Body=part
        )
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})

    def commit(self) -> None:
        if self._upload_id is None:
            self._client.put_object(Bucket=self._bucket, Key=self._name, Body=bytes(self._buf))
            return
        if self._buf:
            self._ship(bytes(self._buf))
        self._client.complete_multipart_upload(
            Bucket=self._bucket, Key=self._name, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
        )

    def abort(self) -> None:
        if self._upload_id is not None:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._name, UploadId=self._upload_id)


class S3ObjectStore:
    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        part_size: int = DEFAULT_PART_SIZE,
    ):
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below {MIN_PART_SIZE} (5 MiB), the S3 minimum; raise it")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError("an S3 storage URL names its bucket: s3://bucket or s3://bucket/prefix")
        prefix = prefix.strip("/")
        if prefix:
            check_prefix(prefix)
        self.url = url
        self.bucket = bucket
        self._root = f"{prefix}/" if prefix else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self.part_size = part_size
        # Third-party endpoints (SeaweedFS, MinIO) are reached by path; v4 signing is what every
        # S3-compatible server accepts for presigned URLs with response-header overrides.
        addressing = "path" if endpoint_url else "auto"
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(signature_version="s3v4", s3={"addressing_style": addressing}, retries={"mode": "standard"}),
        )

    def spec(self) -> tuple[str, str | None, str]:
        return (self.url, self._endpoint_url, self._region)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A boto3 client does not pickle; Ray tasks get a fresh one built from the same arguments.
        return (S3ObjectStore, (*self.spec(), self.part_size))

    def _name(self, key: str) -> str:
        return self._root + check_key(key)

    @contextmanager
    def writer(self, key: str) -> Iterator[_PartWriter]:
        w = _PartWriter(self._client, self.bucket, self._name(key), self.part_size)
        try:
            yield w
            w.commit()
        except BaseException:
            w.abort()
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)

    def _get(self, key: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return self._client.get_object(Bucket=self.bucket, Key=self._name(key), **kwargs)
        except ClientError as exc:
            if _is_not_found(exc):
                raise ObjectNotFound(key) from None
            raise

    def get_bytes(self, key: str) -> bytes:
        return self._get(key)["Body"].read()

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        body = self._get(key)["Body"]

        def chunks() -> Iterator[bytes]:
            with body:
                yield from body.iter_chunks(chunk_size)

        return chunks()

    def iter_into(self, key: str, buf: memoryview) -> Iterator[memoryview]:
        body = self._get(key)["Body"]

        def chunks() -> Iterator[memoryview]:
            with body:
                while n := _read_into(body, buf):
                    yield buf[:n]

        return chunks()

    def read_range(self, key: str, start: int, end: int) -> bytes:
        check_range(start, end)
        if start == end:
            self.size(key)  # still raise ObjectNotFound for a missing key
            return b""
        try:
            return self._get(key, Range=f"bytes={start}-{end - 1}")["Body"].read()
        except ClientError as exc:
            # A range starting at or past the end is 416 on S3; slicing semantics give b"".
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise

    def size(self, key: str) -> int:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=self._name(key))["ContentLength"]
        except ClientError as exc:
            if _is_not_found(exc):
                raise ObjectNotFound(key) from None
            raise

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFound:
            return False
        return True

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._name(key))

    def delete_prefix(self, prefix: str) -> int:
        if not check_prefix(prefix):
            raise ValueError("delete_prefix needs a non-empty prefix; deleting the whole store is not offered")
        count = 0
        batch: list[str] = []
        for key in self.list(prefix):
            batch.append(key)
            if len(batch) == _DELETE_BATCH:
                count += self._delete_batch(batch)
                batch = []
        if batch:
            count += self._delete_batch(batch)
        return count

    def _delete_batch(self, keys: list[str]) -> int:
        resp = self._client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": self._root + k} for k in keys], "Quiet": True}
        )
        errors = resp.get("Errors") or []
        if errors:
            first = errors[0]
            raise OSError(
                f"S3 refused to delete {len(errors)} of {len(keys)} objects in bucket {self.bucket!r}; "
                f"first: {first.get('Code')} {first.get('Message')}"
            )
        return len(keys)

    def list(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        return self._iter_keys(self._root + prefix)

    def _iter_keys(self, full_prefix: str) -> Iterator[str]:
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full_prefix)
        cut = len(self._root)
        # S3 returns keys in UTF-8 byte order, which is also Python's str order: already sorted.
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"][cut:]

    def presigned_get_url(self, key: str, expires_s: int, headers: dict[str, str] | None = None) -> str:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._name(key)}
        for name, value in (headers or {}).items():
            override = _RESPONSE_OVERRIDES.get(name.lower())
            if override is None:
                raise ValueError(f"header {name!r} cannot be set on a presigned GET; use one of {sorted(_RESPONSE_OVERRIDES)}")
            params[override] = value
        return self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s)

    def presigned_put_url(self, key: str, expires_s: int) -> str:
        return self._client.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": self._name(key)}, ExpiresIn=expires_s
        )

    def local_path(self, key: str) -> None:
        check_key(key)
        return None


def _read_into(body: Any, buf: memoryview) -> int:
    """Fill `buf` from a streaming GET body; fewer bytes only at the object's end."""
    n = 0
    while n < len(buf):
        data = body.read(len(buf) - n)
        if not data:
            break
        buf[n : n + len(data)] = data
        n += len(data)
    return n
