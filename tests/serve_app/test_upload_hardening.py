"""POST /v1/files as a hostile client sends it: every order of the form's parts, repeated fields,
bodies cut short, malformed multipart framing, oversized bodies, and the per-account file limits
under concurrent uploads. Raw httpx and sockets against the deployed Serve app (SQLite and
PostgreSQL); every refusal checks status, code, param and that nothing was stored."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from openft.errors import RateLimited
from serve_app.services.files_upload import MAX_BODY_BYTES
from storage.db import Database
from storage.objects import open_object_store
from tests.serve_app.test_files_api import GOOD, _chat, _line

B = "hardening-b0undary"
CT = f"multipart/form-data; boundary={B}"
BATCH = _line({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}) * 3


def part(name: str, data: bytes, filename: str | None = None, *, boundary: str = B) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"


def form(*parts: bytes, end: bool = True) -> bytes:
    return b"".join(parts) + (f"--{B}--\r\n".encode() if end else b"")


PURPOSE = part("purpose", b"fine-tune")
FILE = part("file", GOOD, "train.jsonl")
EXTRA = part("note", b"hello")


def post(api, key: str, body, content_type: str | None = CT, **headers) -> httpx.Response:
    if content_type is not None:
        headers["Content-Type"] = content_type
    return httpx.post(api.base_url + "/files", content=body, headers={"Authorization": f"Bearer {key}", **headers},
                      timeout=120)


def assert_refused(r: httpx.Response, status: int, code: str, param: str | None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err
    return err


_STORES: dict[str, object] = {}


def _stored_keys(api, account_id: str) -> list[str]:
    if api.name not in _STORES:
        settings = api.settings
        _STORES[api.name] = open_object_store(settings.resolved_storage_url(), s3_endpoint_url=settings.s3_endpoint_url,
                                              s3_region=settings.s3_region)
    return list(_STORES[api.name].list(f"files/{account_id}/"))


def assert_nothing_stored(api, account) -> None:
    client, account_id, _ = account
    assert client.files.list().data == []
    assert _stored_keys(api, account_id) == []


def _tmp_dir(api) -> Path:
    return Path(urlsplit(api.settings.resolved_storage_url()).path) / ".tmp"


# -- one rule per field: every order of the parts ----------------------------------------------
ORDERS = {
    "purpose_then_file": ([PURPOSE, FILE], None),
    "file_then_purpose": ([FILE, PURPOSE], None),
    "extra_first": ([EXTRA, PURPOSE, FILE], None),
    "extra_between": ([PURPOSE, EXTRA, FILE], None),
    "extra_last": ([FILE, PURPOSE, EXTRA], None),
    "purpose_twice_before_file": ([PURPOSE, PURPOSE, FILE], ("invalid_request", "purpose")),
    # The swap: checked as a batch file, then relabelled fine-tune (stored as such before the fix).
    "purpose_swapped_after_file": (
        [part("purpose", b"batch"), part("file", BATCH, "b.jsonl"), PURPOSE], ("invalid_request", "purpose")),
    "purpose_twice_after_file": ([FILE, PURPOSE, PURPOSE], ("invalid_request", "purpose")),
    "purpose_around_file": ([PURPOSE, FILE, PURPOSE], ("invalid_request", "purpose")),
    "file_twice": ([PURPOSE, FILE, FILE], ("invalid_request", "file")),
    "file_twice_purpose_last": ([FILE, FILE, PURPOSE], ("invalid_request", "file")),
    "extra_twice": ([EXTRA, PURPOSE, FILE, EXTRA], ("invalid_request", "note")),
    "no_purpose": ([FILE, EXTRA], ("missing_required_parameter", "purpose")),
    "no_file": ([PURPOSE, EXTRA], ("missing_required_parameter", "file")),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_every_order_of_the_parts(api, account, order):
    client, account_id, key = account
    parts, refusal = ORDERS[order]
    r = post(api, key, form(*parts))
    if refusal is None:
        assert r.status_code == 200, r.text
        f = r.json()
        assert f["purpose"] == "fine-tune" and f["gridline"]["rows"] == 30 and f["bytes"] == len(GOOD)
        assert [x.id for x in client.files.list().data] == [f["id"]]
        assert _stored_keys(api, account_id) == [f"files/{account_id}/{f['id']}"]
        return
    assert_refused(r, 400, *refusal)
    assert_nothing_stored(api, account)


def test_late_purpose_is_validated_in_full_for_itself(api, account):
    """A purpose after the file: the stored bytes are checked as that purpose before the row exists."""
    _, _, key = account
    r = post(api, key, form(part("file", BATCH, "b.jsonl"), PURPOSE))
    err = assert_refused(r, 400, "invalid_messages", "file")
    assert "line 1" in err["message"]
    assert_nothing_stored(api, account)


def test_bom_on_a_later_line_names_that_line(api, account):
    _, _, key = account
    lines = [_line(_chat(user=f"q{i}")) for i in range(6)]
    lines[4] = b"\xef\xbb\xbf" + lines[4]
    err = assert_refused(post(api, key, form(PURPOSE, part("file", b"".join(lines), "t.jsonl"))),
                         400, "invalid_json", "file")
    assert err["message"].startswith("line 5: the line starts with a byte-order mark"), err["message"]
    assert "file starts" not in err["message"]
    assert_nothing_stored(api, account)


# -- all or nothing: bodies that never reach their closing boundary -----------------------------
def test_body_without_closing_boundary_is_refused(api, account):
    _, _, key = account
    for body in (form(PURPOSE, FILE, end=False),  # ends at a newline
                 form(PURPOSE, FILE, end=False) + f"--{B}".encode(),  # the closing boundary's dashes missing
                 form(PURPOSE, FILE, end=False) + f"--{B}-".encode(),  # one dash short of the close delimiter
                 form(PURPOSE, FILE, end=False) + f"--{B}\r\n".encode()):  # a part opened, never sent
        assert_refused(post(api, key, body), 400, "incomplete_upload", "file")
    assert_nothing_stored(api, account)


def test_close_delimiter_without_its_trailing_crlf_is_a_whole_body(api, account):
    """RFC 2046 5.1.1: the CRLF after `--boundary--` is optional (the fuzz suite's oracle had it required)."""
    client, _, key = account
    for tail in (b"", b"\r"):
        r = post(api, key, form(PURPOSE, FILE, end=False) + f"--{B}--".encode() + tail)
        assert r.status_code == 200, r.text
        client.files.delete(r.json()["id"])
    assert_nothing_stored(api, account)


def test_chunked_upload_cut_off_but_ended_cleanly_is_refused(api, account):
    """20,000 lines, then the chunked encoding's clean end, with no closing boundary."""
    _, _, key = account
    row = _line(_chat(user="x", assistant="y"))

    def body():
        yield PURPOSE + f"--{B}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.jsonl\"\r\n\r\n".encode()
        for _ in range(20):
            yield row * 1000

    assert_refused(post(api, key, body()), 400, "incomplete_upload", "file")
    assert_nothing_stored(api, account)


def _raw_socket(api) -> tuple[socket.socket, str]:
    url = urlsplit(api.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=60), url.path + "/files"


@pytest.mark.parametrize("framing", ["content_length", "chunked"])
def test_client_that_disconnects_mid_body_leaves_nothing(api, account, framing):
    _, _, key = account
    tmp = _tmp_dir(api)
    assert not any(tmp.iterdir())
    head = PURPOSE + f"--{B}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.jsonl\"\r\n\r\n".encode()
    data = head + GOOD * (2 * 1024 * 1024 // len(GOOD) + 1)
    sock, path = _raw_socket(api)
    length = "Transfer-Encoding: chunked" if framing == "chunked" else f"Content-Length: {len(data) * 4}"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: {CT}\r\n"
                 f"{length}\r\n\r\n".encode())
    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data) if framing == "chunked" else data)
    deadline = time.monotonic() + 60
    while not any(tmp.iterdir()):  # the upload is being written
        assert time.monotonic() < deadline, "the upload's temporary file never appeared"
        time.sleep(0.05)
    sock.close()
    # And then discarded: at once when the proxy passes the disconnect on, at the latest when the
    # body's idle cut-off (body_idle_timeout_seconds) ends the wait for the next chunk. Timed from
    # the close, with that cut-off twice over: on a loaded machine the first wait took most of a
    # deadline the two shared (issue 23's note).
    closed = time.monotonic()
    while any(tmp.iterdir()):
        outlived = time.monotonic() - closed
        assert outlived < 2 * api.settings.body_idle_timeout_seconds, \
            f"a temporary file outlived the disconnect by {outlived:.0f} s: {[p.name for p in tmp.iterdir()]}"
        time.sleep(0.05)
    assert_nothing_stored(api, account)


# -- every malformed form is a 400 with a code -----------------------------------------------
def _header_body(header: bytes) -> bytes:
    return f"--{B}\r\n".encode() + header + b"\r\n\r\nfine-tune\r\n" + FILE + f"--{B}--\r\n".encode()


MALFORMED = {
    "garbage_body": ("multipart/form-data; boundary=X", b"this is not a multipart body at all", "invalid_multipart"),
    "empty_body": (CT, b"", "invalid_multipart"),
    "empty_boundary": ('multipart/form-data; boundary=""', form(PURPOSE, FILE), "invalid_multipart"),
    "no_boundary": ("multipart/form-data", form(PURPOSE, FILE), "invalid_multipart"),
    "boundary_not_in_body": ("multipart/form-data; boundary=other", form(PURPOSE, FILE), "invalid_multipart"),
    # 5,000 characters: a longer Content-Type is a header over http_max_header_field_bytes (431).
    "boundary_5000_chars": ("multipart/form-data; boundary=" + "b" * 5_000, form(PURPOSE, FILE), "invalid_multipart"),
    "unclosed_quote": (f'multipart/form-data; boundary="{B}', form(PURPOSE, FILE), "invalid_multipart"),
    "duplicate_boundary": (f"multipart/form-data; boundary={B}; boundary=other", form(PURPOSE, FILE),
                           "invalid_multipart"),
    "header_without_colon": (CT, _header_body(b'Content-Disposition form-data; name="purpose"'), "invalid_multipart"),
    "header_2_mb": (CT, _header_body(b"X-Pad: " + b"p" * (2 * 1024 * 1024)), "invalid_multipart"),
    "no_content_disposition": (CT, _header_body(b"Content-Type: text/plain"), "invalid_multipart"),
    "two_names": (CT, _header_body(b'Content-Disposition: form-data; name="purpose"; name="file"'),
                  "invalid_multipart"),
    "two_dispositions": (CT, _header_body(b'Content-Disposition: form-data; name="purpose"\r\n'
                                          b'Content-Disposition: form-data; name="file"'), "invalid_multipart"),
    "nine_headers": (CT, _header_body(b'Content-Disposition: form-data; name="purpose"\r\n'
                                      + b"\r\n".join(b"X-H%d: v" % i for i in range(8))), "invalid_multipart"),
    "not_a_boundary_line": (CT, f"--{B}xyz\r\n".encode() + form(PURPOSE, FILE), "invalid_multipart"),
    "field_name_65_chars": (CT, form(part("n" * 65, b"v"), PURPOSE, FILE), "invalid_request"),
    "seventeen_parts": (CT, form(*[part(f"f{i}", b"v") for i in range(15)], PURPOSE, FILE), "too_many_fields"),
    "not_multipart": ("application/json", b'{"purpose": "fine-tune"}', "invalid_request"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_forms_are_400_with_a_code(api, account, case):
    _, _, key = account
    content_type, body, code = MALFORMED[case]
    r = post(api, key, body, content_type)
    err = assert_refused(r, 400, code, "file" if case == "not_multipart" else None)
    assert "pppp" not in err["message"] and "this is not" not in err["message"]
    assert_nothing_stored(api, account)


def test_sixteen_parts_are_allowed(api, account):
    _, _, key = account
    r = post(api, key, form(*[part(f"f{i}", b"v") for i in range(14)], PURPOSE, FILE))
    assert r.status_code == 200, r.text


# -- bounds --------------------------------------------------------------------------------------
def test_oversized_content_length_is_refused_before_the_body(api, account):
    _, _, key = account
    sock, path = _raw_socket(api)
    with sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: {CT}\r\n"
                     f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        response = b""
        while chunk := sock.recv(65536):  # answered, and closed, with no body byte sent
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    err = httpx.Response(413, content=body).json()["error"]
    assert (err["code"], err["param"]) == ("request_too_large", None)
    assert f"{MAX_BODY_BYTES:,} bytes" in err["message"]
    assert_nothing_stored(api, account)


def test_bytes_read_after_a_refusal_are_bounded(api, account):
    """A short rest is read so the client sees the refusal on a live connection; past
    upload_drain_bytes (1 MiB) the refusal closes the connection instead."""
    _, _, key = account
    refused = form(PURPOSE, PURPOSE, FILE)
    small = post(api, key, refused)
    assert_refused(small, 400, "invalid_request", "purpose")
    assert small.headers.get("connection") != "close"
    big = post(api, key, form(PURPOSE, PURPOSE, part("file", GOOD * (4 * 1024 * 1024 // len(GOOD)), "t.jsonl")))
    assert_refused(big, 400, "invalid_request", "purpose")
    assert big.headers.get("connection") == "close"
    assert_nothing_stored(api, account)


# -- per-account file limits ---------------------------------------------------------------------
MAX_ACCOUNT_BYTES = 2_000_000


@pytest.fixture(scope="module")
def limits_api(apis, request):
    """PostgreSQL, with room for 3 files and 2 MB per account."""
    return apis("uploads-limits", account_max_files=3, account_max_file_bytes=MAX_ACCOUNT_BYTES,
                database_url=request.getfixturevalue("pg_database_url"))


def _objects_match_rows(api, account_id: str) -> None:
    db = Database(api.settings.resolved_database_url(), migrate=False)
    try:
        from storage.models import File

        with db.session() as session:
            keys = sorted(r.object_key for r in session.query(File).filter_by(account_id=account_id, deleted_at=None))
    finally:
        db.dispose()
    assert keys == sorted(_stored_keys(api, account_id))


def test_parallel_uploads_stop_exactly_at_the_file_limit(limits_api):
    first, key = limits_api.create_account()
    second, other_key = limits_api.create_account()
    keys = [key] * 8 + [other_key] * 2
    with ThreadPoolExecutor(len(keys)) as pool:
        results = list(pool.map(lambda k: post(limits_api, k, form(PURPOSE, FILE)), keys))
    mine, others = results[:8], results[8:]
    assert sorted(r.status_code for r in mine) == [200] * 3 + [429] * 5
    for r in mine:
        if r.status_code == 429:
            err = assert_refused(r, 429, "limit_exceeded", "file")
            assert err["type"] == "rate_limit_error" and err["limit"] == {"limit": 3, "current": 3}
    assert [r.status_code for r in others] == [200, 200]
    for account_id, n in ((first, 3), (second, 2)):
        assert len(limits_api.client(key if account_id == first else other_key).files.list().data) == n
        _objects_match_rows(limits_api, account_id)
    # Deleting one makes room for one.
    client = limits_api.client(key)
    client.files.delete(client.files.list().data[0].id)
    assert post(limits_api, key, form(PURPOSE, FILE)).status_code == 200
    assert_refused(post(limits_api, key, form(PURPOSE, FILE)), 429, "limit_exceeded", "file")
    _objects_match_rows(limits_api, first)


def test_byte_limit_refuses_while_streaming_and_stores_nothing(limits_api):
    account_id, key = limits_api.create_account()
    client = limits_api.client(key)
    assert post(limits_api, key, form(PURPOSE, FILE)).status_code == 200
    used = len(GOOD)
    big = GOOD * (MAX_ACCOUNT_BYTES // len(GOOD) + 1)
    early = post(limits_api, key, form(PURPOSE, part("file", big, "t.jsonl")))
    err = assert_refused(early, 429, "limit_exceeded", "file")
    assert err["limit"] == {"limit": MAX_ACCOUNT_BYTES, "current": used}
    late_purpose = post(limits_api, key, form(part("file", big, "t.jsonl"), PURPOSE))
    late = assert_refused(late_purpose, 429, "limit_exceeded", "file")
    assert late["limit"] == err["limit"]
    assert len(client.files.list().data) == 1
    _objects_match_rows(limits_api, account_id)


def test_results_files_count_and_expired_files_do_not(limits_api):
    """Every live row counts, whatever wrote it (here a job's results file); an expired one does not."""
    from openft.ids import file_id
    from storage.models import File

    account_id, key = limits_api.create_account()
    now = int(time.time())
    db = Database(limits_api.settings.resolved_database_url(), migrate=False)
    try:
        with db.session() as session:
            for purpose, expires in (("fine-tune-results", now + 3600), ("fine-tune", now - 1)):
                fid = file_id()
                session.add(File(id=fid, account_id=account_id, filename="r.csv", purpose=purpose, bytes=10,
                                 created_at=now, created_ns=time.time_ns(), expires_at=expires, status="processed",
                                 sha256="0" * 64, object_key=f"files/{account_id}/{fid}", stats={}))
    finally:
        db.dispose()
    assert [post(limits_api, key, form(PURPOSE, FILE)).status_code for _ in range(3)] == [200, 200, 429]


def test_files_are_recorded_all_or_none(limits_api):
    """record_files (distillations record two files with it) inserts every row or none, and
    deletes every object when it refuses."""
    from openft.ids import file_id
    from pipelines.validate import FileStats
    from files.record import NewFile, record_files
    from serve_app.state import AppState
    from storage.models import Account

    account_id, _ = limits_api.create_account()
    state = AppState.from_settings(limits_api.settings)
    try:
        with state.db.session() as session:
            account = session.get(Account, account_id)
        new = []
        for _ in range(4):
            fid = file_id()
            state.store.put_bytes(f"files/{account_id}/{fid}", GOOD)
            new.append(NewFile(file_id=fid, key=f"files/{account_id}/{fid}", filename="t.jsonl", purpose="fine-tune",
                               size=len(GOOD), sha256="0" * 64, stats=FileStats(rows=30)))
        with pytest.raises(RateLimited) as info:
            record_files(state, account.id, new)
        assert (info.value.code, info.value.param) == ("limit_exceeded", "file")
        assert _stored_keys(limits_api, account_id) == []
        _objects_match_rows(limits_api, account_id)
    finally:
        state.db.dispose()


@pytest.mark.heavy
def test_distillation_records_both_files_or_neither(limits_api):
    """Two batch files leave room for one: the distillation's two files are refused together,
    after its pipeline ran, and leave neither a row nor an object."""
    from tests.factories import distill_files

    account_id, key = limits_api.create_account()
    client = limits_api.client(key)
    results, requests, _ = distill_files("openai", 50, seed=1)
    res = post(limits_api, key, form(part("purpose", b"batch_output"), part("file", results, "r.jsonl"))).json()
    req = post(limits_api, key, form(part("purpose", b"batch"), part("file", requests, "q.jsonl"))).json()
    r = httpx.post(limits_api.base_url + "/files/distill", json={"results_file": res["id"], "requests_file": req["id"]},
                   headers={"Authorization": f"Bearer {key}"}, timeout=300)
    err = assert_refused(r, 429, "limit_exceeded", "file")
    assert err["limit"] == {"limit": 3, "current": 2}
    assert sorted(f.id for f in client.files.list().data) == sorted([res["id"], req["id"]])
    _objects_match_rows(limits_api, account_id)
