"""Property-based fuzzing of the upload's multipart framing (raw bodies, not an SDK's).

Generated Content-Type headers (boundaries empty, huge, quoted, unclosed, repeated) and bodies
(parts with or without names, header lines without a colon, repeated fields, garbage, bodies cut
anywhere or missing the closing boundary). Properties: never a 5xx; a refusal is OpenAI's
envelope and leaves nothing listed or stored; a body without its closing boundary is never
stored. Default profile in-process (uvicorn, real HTTP); the large one adds PostgreSQL through
Serve.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from serve_app.state import AppState
from tests.fuzz.conftest import ENVELOPE_KEYS, serve_in_thread, stored_keys
from tests.fuzz.jsonl import MARKER

GOOD_FILE = orjson.dumps({"messages": [{"role": "user", "content": MARKER}, {"role": "assistant", "content": "ok"}]})
_BOUNDARIES = st.one_of(
    st.sampled_from(["b0und", "x" * 70, "x" * 10_000, "", "a b", "\u00e9t\u00e9", "--", "b;c", "=?"]),
    st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters='"'), min_size=1, max_size=20),
)


@st.composite
def uploads(draw) -> tuple[dict, bytes, bool]:
    """(headers, body, whether the body ends with its closing boundary)."""
    boundary = draw(_BOUNDARIES)
    ctype = draw(st.sampled_from([
        "multipart/form-data; boundary={b}", 'multipart/form-data; boundary="{b}"', 'multipart/form-data; boundary="{b}',
        "multipart/form-data; boundary={b}; boundary=other", "multipart/form-data", "multipart/mixed; boundary={b}",
        "application/json", "multipart/form-data; boundary={b}; charset=utf-8",
    ])).format(b=boundary)
    dash = b"--" + boundary.encode()
    parts = []
    if draw(st.booleans()):  # a well-formed upload first, so that the faults after it are what decides
        parts += [dash + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n',
                  dash + b'\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n\r\n'
                  + GOOD_FILE + b"\n\r\n"]
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["purpose", "file", "", "other", "purpose"]))
        header = draw(st.sampled_from([
            f'Content-Disposition: form-data; name="{name}"',
            f'Content-Disposition: form-data; name="{name}"; filename="{MARKER}.jsonl"',
            f'Content-Disposition: form-data; name="{name}',
            "Content-Disposition form-data no colon", "X-Other: 1", f"Content-Disposition: {MARKER}",
        ])).encode()
        value = draw(st.sampled_from([b"fine-tune", b"batch", GOOD_FILE + b"\n", b"", MARKER.encode(),
                                      GOOD_FILE + b"\n" + dash, b"\r\n\r\n"]))
        parts.append(dash + b"\r\n" + header + b"\r\n\r\n" + value + b"\r\n")
    body = b"".join(parts)
    closed = draw(st.booleans())
    if closed:
        body += dash + b"--\r\n"
    cut = draw(st.one_of(st.none(), st.integers(0, max(len(body) - 1, 0))))
    if cut is not None:
        # RFC 2046 5.1.1: the CRLF after the close delimiter is optional (`--b--` ends a body), so
        # a cut inside that CRLF leaves the body closed; a cut anywhere before it does not.
        body, closed = body[:cut], closed and cut >= len(body) - 2
    if draw(st.integers(0, 9)) == 0:
        body, closed = draw(st.binary(max_size=200)) + MARKER.encode(), False
    return {"content-type": ctype.encode()}, body, closed and body.rstrip(b"\r\n").endswith(dash + b"--")


def _fuzz(http: httpx.Client, state: AppState, account_id: str, examples: int, derandomize: bool) -> Counter:
    outcomes: Counter = Counter()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize, print_blob=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(uploads())
    def run(upload):
        headers, body, closed = upload
        before = stored_keys(state, account_id)
        listed = [f["id"] for f in http.get("/files").json()["data"]]
        r = http.post("/files", content=body, headers=headers)
        assert r.status_code < 500, f"{r.status_code}: {r.text[:200]}"
        outcomes[r.status_code] += 1
        if r.status_code == 200:
            assert closed, "a body without its closing boundary was stored"
            http.delete(f"/files/{r.json()['id']}").raise_for_status()
            return
        payload = r.json()
        assert set(payload) == {"error"} and set(payload["error"]) == ENVELOPE_KEYS, r.text[:300]
        assert MARKER not in r.text
        assert [f["id"] for f in http.get("/files").json()["data"]] == listed
        assert stored_keys(state, account_id) == before

    run()
    return outcomes


def _client(base_url: str, key: str) -> httpx.Client:
    # A connection per request: a server that drops a connection after a fault would otherwise
    # fail the next request on it, and the report would name the wrong body.
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                        limits=httpx.Limits(max_keepalive_connections=0))


PROFILES = [pytest.param(300, id="default"), pytest.param(1500, id="large", marks=pytest.mark.fuzz_large)]


@pytest.mark.parametrize("examples", PROFILES)
def test_generated_multipart_bodies(examples, fuzz_api, fuzz_report):
    account_id, key = fuzz_api.create_account()
    started = time.monotonic()
    with serve_in_thread(fuzz_api.settings) as (base_url, state):
        http = _client(base_url, key)
        outcomes = _fuzz(http, state, account_id, examples, derandomize=examples < 1000)
    fuzz_report(f"multipart [{'default' if examples < 1000 else 'large'}, sqlite, in-process]: "
                f"{sum(outcomes.values())} bodies in {time.monotonic() - started:.1f} s, "
                f"by status {dict(sorted(outcomes.items()))}")


@pytest.mark.fuzz_large
def test_generated_multipart_bodies_postgres_serve(fuzz_pg_api, fuzz_report):
    account_id, key = fuzz_pg_api.create_account()
    started = time.monotonic()
    http = _client(fuzz_pg_api.base_url, key)
    outcomes = _fuzz(http, AppState.from_settings(fuzz_pg_api.settings), account_id, 500, derandomize=False)
    fuzz_report(f"multipart [large, postgres, Serve]: {sum(outcomes.values())} bodies in "
                f"{time.monotonic() - started:.1f} s, by status {dict(sorted(outcomes.items()))}")
