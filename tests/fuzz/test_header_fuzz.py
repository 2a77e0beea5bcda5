"""Property-based fuzzing of request heads (issue 24), as raw bytes over a socket: header counts
(0 to 2,500), field sizes (to 20 KiB, and to 1 MiB in the large profile), request lines to 10 KiB,
and numbers in every header and query parameter the service parses: `Range` (digits to 5,000,
suffixes, several ranges, garbage), `Content-Length` (digits to 5,000, negative, two of them),
`Authorization` (a real key, garbage, schemes, non-ASCII, 100 KiB), `Content-Type`'s boundary,
Ray Serve's `x-request-timeout-seconds` (nan, inf, 400 digits), and `limit`/`after` in the query.

Properties: an answer always comes (no hang, no reset without one); never a 5xx; every 4xx with a
body is OpenAI's envelope. The default profile (make test) sends its heads to the app on uvicorn
with the Serve proxy's bounded protocol (entrypoints/serve_proxy.py) in-process and a sample
through the deployed Serve proxy; the large one (make test-fuzz) sends more, and through Serve to
the PostgreSQL deployment.
"""

from __future__ import annotations

import time
from collections import Counter
from urllib.parse import urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from serve_app.services.blob_tokens import Blob, seal
from serve_app.state import AppState
from storage.models import File
from tests.fuzz.conftest import ENVELOPE_KEYS, serve_in_thread
from tests.utils.raw_http import exchange

# Short numbers, and ones about Python's int() limit of 4,300 digits (where ByteRange.parse raised).
_DIGITS = st.one_of(st.integers(0, 40), st.integers(4290, 5000)).flatmap(
    lambda n: st.text("0123456789", min_size=n, max_size=n))
NUMBERS = st.one_of(
    st.integers(-10**20, 10**20).map(str), _DIGITS, st.sampled_from(["", "-0", "+5", "1e9", "0x10", "1_000", "nan",
                                                                    "inf", "-inf", "\u0661\u0662", " 7 ", "1.5"]),
)
RANGES = st.one_of(
    st.tuples(NUMBERS, NUMBERS).map(lambda p: f"bytes={p[0]}-{p[1]}"), NUMBERS.map(lambda n: f"bytes=-{n}"),
    NUMBERS.map(lambda n: f"bytes={n}-"), st.just("bytes=0-1,5-6"), st.just("items=0-1"), st.text(max_size=50),
)


@st.composite
def heads(draw, key: str, blob: str, file_id: str, huge: int) -> bytes:
    target = draw(st.sampled_from([
        "/v1/files", "/v1/files?limit={n}", "/v1/files?after={n}&limit={n}", f"/v1/files/{file_id}/content",
        "/v1/fine_tuning/jobs?limit={n}", "/v1/batches?limit={n}&after={n}", "/v1/gridline/api_keys?limit={n}",
        "/v1/webhook_endpoints?limit={n}", f"/v1/gridline/blobs/{blob}", "/v1/gridline/blobs/garbage",
        "/v1/gridline/adapters/ft:none/files/adapter_model.safetensors", "/v1/models",
    ]))
    target = target.replace("{n}", draw(NUMBERS.filter(lambda n: n.isascii() and " " not in n and "&" not in n)))
    if draw(st.integers(0, 20)) == 0:
        target += "&pad=" + "p" * draw(st.integers(0, 10_000))
    method = draw(st.sampled_from(["GET", "GET", "HEAD", "POST", "DELETE"]))
    fields: list[tuple[str, str]] = [("Host", "127.0.0.1")]
    auth = draw(st.sampled_from(["key", "key", "key", "none", "garbage", "scheme", "huge", "unicode"]))
    fields += {"key": [("Authorization", f"Bearer {key}")], "none": [],
               "garbage": [("Authorization", "Bearer " + draw(st.text("abcdef-_=0123456789", max_size=200)))],
               "scheme": [("Authorization", f"Basic {key}")], "huge": [("Authorization", "Bearer " + "k" * huge)],
               "unicode": [("Authorization", "Bearer sk-\u00e9\u00e9")]}[auth]
    if draw(st.integers(0, 2)):
        fields.append(("Range", draw(RANGES)))
    if draw(st.booleans()):
        fields.append(("X-Request-Timeout-Seconds", draw(st.one_of(NUMBERS, st.sampled_from(["nan", "inf", "9" * 400])))))
    body = b""
    if method == "POST":
        kind = draw(st.sampled_from(["exact", "huge", "garbage", "twice", "multipart"]))
        if kind == "exact":
            body = orjson.dumps({"name": "k"})
            fields.append(("Content-Length", str(len(body))))
        elif kind == "huge":  # past every route's limit: refused before a byte is read
            fields.append(("Content-Length", "9" * draw(st.integers(10, 5000))))
        elif kind == "garbage":
            fields.append(("Content-Length", draw(st.sampled_from(["-1", "abc", "1e3", " ", "0x10", "\u0661"]))))
        elif kind == "twice":
            fields += [("Content-Length", "2"), ("Content-Length", "3")]
            body = b"{}"
        else:
            boundary = "b" * draw(st.integers(0, 12_000))
            body = f"--{boundary}--\r\n".encode()
            fields += [("Content-Type", f"multipart/form-data; boundary={boundary}"), ("Content-Length", str(len(body)))]
    for i in range(draw(st.sampled_from([0, 0, 0, 0, 5, 99, 100, 101, 500, 2500]))):
        fields.append((f"X-F{i}", "v"))
    if draw(st.integers(0, 7)) == 0:
        fields.append(("X-Big", "b" * draw(st.integers(0, 20_000))))
    fields.append(("Connection", "close"))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    return head.encode("utf-8") + body


def _fuzz(port: int, prefix: str, strategy, examples: int, derandomize: bool) -> Counter:
    outcomes: Counter = Counter()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize, print_blob=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(request: bytes):
        line, _, rest = request.partition(b" ")
        target, _, rest = rest.partition(b" ")
        answer = exchange(port, line + b" " + prefix.encode() + target + b" " + rest, timeout=60)
        assert answer.status is not None, f"no answer to {request[:200]!r}"
        assert answer.status < 500, (answer.status, answer.body[:300], request[:300])
        outcomes[answer.status] += 1
        if answer.status >= 400 and answer.body and answer.headers.get("content-type") == "application/json":
            payload = orjson.loads(answer.body)
            assert set(payload) == {"error"} and set(payload["error"]) == ENVELOPE_KEYS, answer.body[:300]

    run()
    return outcomes


def _seeds(api) -> tuple[str, str, str]:
    """(a key, a blob token of a stored file, that file's id)."""
    account_id, key = api.create_account()
    upload = api.client(key).files.create(file=("b.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
    state = AppState.from_settings(api.settings)
    with state.db.session() as session:
        row = session.get(File, upload.id)
        blob = Blob(key=row.object_key, sha256=row.sha256, size=row.bytes, name="b.jsonl", expires=int(time.time()) + 3600)
    state.db.dispose()
    return key, seal(api.settings.resolved_signing_secret(), blob), upload.id


PROFILES = [pytest.param(250, 40, 100_000, id="default"),
            pytest.param(3000, 300, 1 << 20, id="large", marks=pytest.mark.fuzz_large)]


@pytest.mark.parametrize("local_examples, serve_examples, huge", PROFILES)
def test_generated_heads(local_examples, serve_examples, huge, fuzz_api, fuzz_report):
    from entrypoints.serve_proxy import BoundedHttpToolsProtocol

    key, blob, file_id = _seeds(fuzz_api)
    profile = "default" if local_examples < 1000 else "large"
    strategy = heads(key, blob, file_id, huge)
    started = time.monotonic()
    with serve_in_thread(fuzz_api.settings, http=BoundedHttpToolsProtocol) as (base_url, _state):
        local = _fuzz(urlsplit(base_url).port, "", strategy, local_examples, derandomize=profile == "default")
    served = urlsplit(fuzz_api.base_url)
    through = _fuzz(served.port, served.path.removesuffix("/v1"), strategy, serve_examples, derandomize=False)
    fuzz_report(f"headers [{profile}, sqlite]: {sum(local.values())} heads in-process (bounded protocol) and "
                f"{sum(through.values())} through the Serve proxy in {time.monotonic() - started:.1f} s, 0 5xx; "
                f"by status {dict(sorted((local + through).items()))}")


@pytest.mark.fuzz_large
def test_generated_heads_postgres_serve(fuzz_pg_api, fuzz_report):
    key, blob, file_id = _seeds(fuzz_pg_api)
    served = urlsplit(fuzz_pg_api.base_url)
    started = time.monotonic()
    through = _fuzz(served.port, served.path.removesuffix("/v1"), heads(key, blob, file_id, 1 << 20), 1000,
                    derandomize=False)
    fuzz_report(f"headers [large, postgres, Serve]: {sum(through.values())} heads in "
                f"{time.monotonic() - started:.1f} s, 0 5xx; by status {dict(sorted(through.items()))}")
