"""The object store's behaviour, identical on a local directory and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import os
import pickle
import random
import urllib.request
from functools import partial

import pytest
from botocore.exceptions import ClientError

from storage._local import STAGE_BYTES
from storage.objects import (
    MIN_PART_SIZE,
    LocalObjectStore,
    ObjectNotFound,
    ObjectStore,
    S3ObjectStore,
    aligned_buffer,
    open_object_store,
)
from tests.utils.seaweed import SeaweedServer

BAD_KEYS = ["", "/abs/key", "a/../b", "..", "./a", "a//b", "a/", ".tmp/x", "a/\x00b"]
BAD_PREFIXES = ["/abs", "../", "a//", "a/../b", ".tmp/"]


class Boom(Exception):
    pass


def _data(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _leftovers(store: ObjectStore) -> list[str]:
    """Temporary data a write left in the backend: local temp files, or open S3 multipart uploads."""
    if isinstance(store, LocalObjectStore):
        return os.listdir(store.root / ".tmp")
    assert isinstance(store, S3ObjectStore)
    uploads = store._client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    return [u["Key"] for u in uploads]


def test_put_get_size_exists(store: ObjectStore):
    store.put_bytes("files/acct/file-abc", b'{"messages": []}\n')

    assert store.get_bytes("files/acct/file-abc") == b'{"messages": []}\n'
    assert store.size("files/acct/file-abc") == 17
    assert store.exists("files/acct/file-abc")
    assert not store.exists("files/acct/file-abd")
    assert not store.exists("files/acct")  # a "directory" is not an object


def test_put_bytes_overwrites(store: ObjectStore):
    store.put_bytes("k", b"first version")
    store.put_bytes("k", b"second")

    assert store.get_bytes("k") == b"second"
    assert store.size("k") == 6


def test_empty_object(store: ObjectStore):
    with store.writer("empty") as w:
        pass

    assert w.bytes_written == 0
    assert store.get_bytes("empty") == b""
    assert store.size("empty") == 0
    assert list(store.iter_chunks("empty")) == []


def test_missing_key_raises_object_not_found(store: ObjectStore):
    calls = [
        lambda: store.get_bytes("nope/x"),
        lambda: store.size("nope/x"),
        lambda: store.read_range("nope/x", 0, 10),
        lambda: store.read_range("nope/x", 3, 3),
        lambda: store.iter_chunks("nope/x"),
    ]
    for call in calls:
        with pytest.raises(ObjectNotFound) as info:
            call()
        assert isinstance(info.value, KeyError)
        assert info.value.key == "nope/x"


def test_writer_publishes_only_on_clean_exit(store: ObjectStore):
    with store.writer("out/result.jsonl") as w:
        w.write(b"line 1\n")
        w.write(b"line 2\n")
        assert not store.exists("out/result.jsonl")
        assert list(store.list("")) == []

    assert w.bytes_written == 14
    assert store.get_bytes("out/result.jsonl") == b"line 1\nline 2\n"
    assert list(store.list("")) == ["out/result.jsonl"]


def test_writer_exception_leaves_nothing_and_keeps_old_version(store: ObjectStore):
    store.put_bytes("ckpt/state", b"old state")

    with pytest.raises(Boom):
        with store.writer("ckpt/state") as w:
            w.write(b"half of the new st")
            raise Boom
    with pytest.raises(Boom):
        with store.writer("ckpt/other") as w:
            w.write(b"never visible")
            raise Boom

    assert store.get_bytes("ckpt/state") == b"old state"
    assert not store.exists("ckpt/other")
    assert list(store.list("")) == ["ckpt/state"]
    assert _leftovers(store) == []


def test_multipart_write_round_trips_byte_identical(store: ObjectStore):
    data = _data(2 * MIN_PART_SIZE + 1_234_567)  # 3 parts, the last one short
    rng = random.Random(1)
    with store.writer("big/blob") as w:
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 3 << 20)  # writes that straddle part boundaries
            w.write(data[pos : pos + step])
            pos += step

    assert w.bytes_written == len(data) == 11_720_327
    assert store.size("big/blob") == len(data)
    assert store.get_bytes("big/blob") == data
    if isinstance(store, S3ObjectStore):
        head = store._client.head_object(Bucket=store.bucket, Key="root/big/blob")
        assert head["ETag"].strip('"').endswith("-3")


def test_crash_mid_multipart_write_leaves_no_debris(store: ObjectStore):
    with pytest.raises(Boom):
        with store.writer("big/partial") as w:
            w.write(_data(MIN_PART_SIZE + 100))  # one part already uploaded on S3
            w.write(_data(MIN_PART_SIZE, seed=1))  # and a second
            raise Boom

    assert list(store.list("")) == []
    assert not store.exists("big/partial")
    assert _leftovers(store) == []


def test_iter_chunks(store: ObjectStore):
    data = _data(1000)
    store.put_bytes("c", data)

    chunks = list(store.iter_chunks("c", chunk_size=300))

    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 300 for c in chunks)
    assert list(store.iter_chunks("c")) == [data]
    with pytest.raises(ValueError):
        store.iter_chunks("c", chunk_size=0)


@pytest.mark.parametrize("size", [0, 5, STAGE_BYTES, 2 * STAGE_BYTES + 4099])
def test_large_writes_in_odd_pieces_and_iter_into(store: ObjectStore, size: int):
    # Pieces that straddle the local store's staging blocks: an object that fills one goes
    # O_DIRECT, its unaligned tail buffered; the bytes must come out exactly as written.
    data = _data(size, seed=size)
    cuts = sorted({0, size, *random.Random(1).sample(range(size + 1), min(size, 6))})
    with store.writer("big/odd") as w:
        for a, b in zip(cuts, cuts[1:]):
            w.write(memoryview(data)[a:b])
        assert w.bytes_written == size

    buf = aligned_buffer(1 << 20)
    chunks = [bytes(c) for c in store.iter_into("big/odd", buf)]
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 1 << 20 for c in chunks)
    assert store.size("big/odd") == size
    # An unaligned buffer still reads correctly (the local store falls back to buffered reads).
    odd = memoryview(bytearray((1 << 20) + 1))[1:]
    assert b"".join(bytes(c) for c in store.iter_into("big/odd", odd)) == data
    tiny = aligned_buffer(4096)  # too small to read ahead into a second half
    assert b"".join(bytes(c) for c in store.iter_into("big/odd", tiny)) == data
    with pytest.raises(ObjectNotFound):
        store.iter_into("big/missing", buf)


def test_read_range(store: ObjectStore):
    data = bytes(range(100))
    store.put_bytes("r", data)

    assert store.read_range("r", 0, 10) == data[0:10]
    assert store.read_range("r", 37, 64) == data[37:64]
    assert store.read_range("r", 90, 200) == data[90:100]
    assert store.read_range("r", 50, 50) == b""
    assert store.read_range("r", 100, 110) == b""
    assert store.read_range("r", 150, 160) == b""
    for start, end in [(-1, 5), (10, 5)]:
        with pytest.raises(ValueError):
            store.read_range("r", start, end)


def test_delete_is_idempotent(store: ObjectStore):
    store.put_bytes("d/x", b"1")
    store.put_bytes("d/y", b"2")

    store.delete("d/x")
    store.delete("d/x")
    store.delete("never/existed")

    assert not store.exists("d/x")
    assert list(store.list("")) == ["d/y"]


def test_delete_prefix(store: ObjectStore):
    for key in ["jobs/ftjob-1/a", "jobs/ftjob-1/ckpt/b", "jobs/ftjob-10/c", "jobs/ftjob-2/d", "files/e"]:
        store.put_bytes(key, b"x")

    assert store.delete_prefix("jobs/ftjob-1/") == 2
    assert list(store.list("")) == ["files/e", "jobs/ftjob-10/c", "jobs/ftjob-2/d"]
    assert store.delete_prefix("jobs/ftjob-1/") == 0
    assert store.delete_prefix("jobs/") == 2
    assert list(store.list("")) == ["files/e"]
    if isinstance(store, LocalObjectStore):
        assert sorted(os.listdir(store.root)) == [".tmp", "files"]  # emptied directories are pruned
    with pytest.raises(ValueError):
        store.delete_prefix("")
    # A writer can still publish under a prefix whose directories were just removed.
    store.put_bytes("jobs/ftjob-1/a", b"again")
    assert store.get_bytes("jobs/ftjob-1/a") == b"again"


def test_list_is_sorted_and_filters_by_string_prefix(store: ObjectStore):
    keys = ["files/b/2", "files/a/1", "files/ab", "adapters/z", "files/a/0", "Files/upper"]
    for key in keys:
        store.put_bytes(key, b"x")

    assert list(store.list("")) == ["Files/upper", "adapters/z", "files/a/0", "files/a/1", "files/ab", "files/b/2"]
    assert list(store.list("files/")) == ["files/a/0", "files/a/1", "files/ab", "files/b/2"]
    assert list(store.list("files/a")) == ["files/a/0", "files/a/1", "files/ab"]
    assert list(store.list("files/a/")) == ["files/a/0", "files/a/1"]
    assert list(store.list("files/c")) == []
    assert list(store.list("nothing/here/")) == []


def test_bad_keys_are_rejected(store: ObjectStore):
    for key in BAD_KEYS:
        calls = [
            partial(store.put_bytes, key, b"x"),
            partial(store.get_bytes, key),
            partial(store.exists, key),
            partial(store.size, key),
            partial(store.delete, key),
            store.writer(key).__enter__,
            partial(store.local_path, key),
            partial(store.presigned_get_url, key, 60),
        ]
        for call in calls:
            with pytest.raises(ValueError):
                call()
    for prefix in BAD_PREFIXES:
        with pytest.raises(ValueError):
            store.list(prefix)
        with pytest.raises(ValueError):
            store.delete_prefix(prefix)
    assert list(store.list("")) == []


def test_store_pickles_and_reopens_from_spec(store: ObjectStore):
    store.put_bytes("p/q", b"payload")

    clone = pickle.loads(pickle.dumps(store))
    reopened = open_object_store(*store.spec())

    assert clone.get_bytes("p/q") == b"payload"
    assert reopened.get_bytes("p/q") == b"payload"
    assert reopened.url == store.url
    assert type(reopened) is type(store)


def test_local_path(store: ObjectStore):
    store.put_bytes("arrays/tokens.bin", b"\x01\x02\x03")

    path = store.local_path("arrays/tokens.bin")

    if isinstance(store, LocalObjectStore):
        assert path.read_bytes() == b"\x01\x02\x03"
        with pytest.raises(ObjectNotFound):
            store.local_path("arrays/missing.bin")
    else:
        assert path is None


def test_presigned_get(store: ObjectStore):
    store.put_bytes("dl/adapter.safetensors", b"weights")

    url = store.presigned_get_url("dl/adapter.safetensors", 60)
    named = store.presigned_get_url(
        "dl/adapter.safetensors", 60, headers={"Content-Disposition": 'attachment; filename="adapter.safetensors"'}
    )

    if isinstance(store, LocalObjectStore):
        assert url is None and named is None
        return
    with urllib.request.urlopen(url) as resp:
        assert resp.read() == b"weights"
    with urllib.request.urlopen(named) as resp:
        assert resp.headers["Content-Disposition"] == 'attachment; filename="adapter.safetensors"'
        assert resp.read() == b"weights"
    with pytest.raises(ValueError):
        store.presigned_get_url("dl/adapter.safetensors", 60, headers={"X-Custom": "1"})


def test_presigned_put(store: ObjectStore):
    url = store.presigned_put_url("up/file.jsonl", 60)

    if isinstance(store, LocalObjectStore):
        assert url is None
        return
    request = urllib.request.Request(url, data=b"uploaded by a client", method="PUT")
    with urllib.request.urlopen(request) as resp:
        assert resp.status == 200
    assert store.get_bytes("up/file.jsonl") == b"uploaded by a client"


def test_s3_prefix_isolates_stores_in_one_bucket(seaweed: SeaweedServer, s3_bucket: str):
    one = open_object_store(f"s3://{s3_bucket}/one", seaweed.endpoint_url)
    two = open_object_store(f"s3://{s3_bucket}/two/", seaweed.endpoint_url)
    whole = open_object_store(f"s3://{s3_bucket}", seaweed.endpoint_url)
    one.put_bytes("k", b"1")
    two.put_bytes("k", b"2")

    assert one.get_bytes("k") == b"1"
    assert two.get_bytes("k") == b"2"
    assert list(one.list("")) == ["k"]
    assert list(whole.list("")) == ["one/k", "two/k"]
    assert one.delete_prefix("k") == 1
    assert list(whole.list("")) == ["two/k"]


def test_s3_credentials_come_from_boto3_chain(seaweed: SeaweedServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    store = open_object_store(f"s3://{s3_bucket}", seaweed.endpoint_url)

    with pytest.raises(ClientError) as info:
        store.put_bytes("k", b"x")
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


@pytest.mark.parametrize(
    "url",
    ["http://example/x", "file://host/dir", "file://relative/dir", "s3://", "s3:///prefix", "s3://bucket/a/../b", "dir",
     # accepted before issue 12: `s3:/bucket` opened a bucket named "s3:", the others a relative directory
     "s3:/bucket", "s3:bucket", "file:relative/dir", "file:/abs/dir", "file:///", "ftp://x", "s3://a", "s3://user@host"],
)
def test_open_object_store_rejects_bad_urls(url: str):
    with pytest.raises(ValueError):
        open_object_store(url)


def test_part_size_below_s3_minimum_is_rejected():
    with pytest.raises(ValueError, match="5 MiB"):
        open_object_store("s3://bucket", "http://127.0.0.1:1", part_size=MIN_PART_SIZE - 1)
