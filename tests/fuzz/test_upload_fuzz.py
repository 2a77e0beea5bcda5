"""Property-based fuzzing of the upload path with generated JSONL files (tests/fuzz/jsonl.py).

For every file, fine-tune or batch: never a 5xx; the marker planted in the file (and in its
filename) never comes back in a refusal, nor anywhere but `filename` in an acceptance; the
verdict (accepted, or the refusal's code) is the upload rules' verdict on the same bytes; a
refusal is OpenAI's envelope with `param: "file"` and leaves nothing behind (GET /v1/files shows
no new file, the store holds no new object); an accepted file downloads byte-identical.

The default profile (`make test`) sends 1,000 generated files to the app served in-process by
uvicorn, a sample through the deployed Serve app, and the 1 MiB line edges through Serve. The
large profile (`make test-fuzz`, marker `fuzz_large`) sends more, on SQLite and PostgreSQL, and
adds the 64 MiB file edges.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings

from pipelines.validate import FileValidationError, StreamingValidator
from serve_app.state import AppState
from tests.fuzz.conftest import ENVELOPE_KEYS, serve_in_thread, stored_keys
from tests.fuzz.jsonl import MARKER, explicit_files, jsonl_files, size_edges

# The documented file limits per purpose (the reference's 64 MiB for fine-tune files).
MAX_BYTES = {"fine-tune": 64 << 20, "batch": 200 << 20}
FILENAME = f"{MARKER}.jsonl"


def expected_verdict(purpose: str, data: bytes) -> str | None:
    """The upload rules' verdict on `data`: None (accepted) or the refusal's code."""
    validator = StreamingValidator(purpose, max_bytes=MAX_BYTES[purpose])
    try:
        for start in range(0, len(data), 1 << 20):
            validator.feed(data[start:start + (1 << 20)])
        validator.finish()
    except FileValidationError as exc:
        return exc.code
    return None


@dataclass
class Uploader:
    """One account on one server: uploads and the checks after each."""

    http: httpx.Client
    state: AppState
    account_id: str
    accepted: list[str] = field(default_factory=list)  # ids of the accepted files, oldest first

    def newest_file_id(self) -> str | None:
        page = self.http.get("/files", params={"limit": 1}).raise_for_status().json()
        return page["data"][0]["id"] if page["data"] else None

    def stored_keys(self) -> set[str]:
        return stored_keys(self.state, self.account_id)

    def check(self, purpose: str, data: bytes) -> str:
        """Upload `data` and check every property; returns the outcome ("accepted" or the code)."""
        before_keys = self.stored_keys()
        r = self.http.post("/files", data={"purpose": purpose}, files={"file": (FILENAME, data, "application/jsonl")})
        where = f"purpose={purpose} bytes={len(data)} head={data[:200]!r}"
        assert r.status_code < 500, f"{r.status_code} on upload: {r.text[:300]} ({where})"
        body = r.json()
        expected = expected_verdict(purpose, data)
        if r.status_code == 200:
            assert expected is None, f"accepted a file the rules refuse with {expected} ({where})"
            shown = orjson.dumps({k: v for k, v in body.items() if k != "filename"})
            assert MARKER.encode() not in shown, f"marker echoed in {r.text[:300]}"
            assert body["object"] == "file" and body["id"].startswith("file-") and body["purpose"] == purpose
            assert body["bytes"] == len(data) and body["status"] == "processed" and body["filename"] == FILENAME
            assert body["gridline"]["sha256"] == hashlib.sha256(data).hexdigest()
            assert self.newest_file_id() == body["id"]
            self.accepted.append(body["id"])
            content = self.http.get(f"/files/{body['id']}/content")
            assert content.status_code == 200 and content.content == data, f"content differs ({where})"
            return "accepted"
        assert MARKER not in r.text, f"marker echoed in {r.text[:300]} ({where})"
        assert set(body) == {"error"} and set(body["error"]) == ENVELOPE_KEYS, r.text[:300]
        err = body["error"]
        assert err["code"] == expected, f"refused with {err['code']}, the rules say {expected} ({where})"
        assert r.status_code == (413 if expected == "file_too_large" else 400) and err["param"] == "file"
        assert isinstance(err["message"], str) and err["type"] == "invalid_request_error"
        if "file starts with" in err["message"]:
            assert err["message"].startswith("line 1:"), f"a later line's fault reported as the file's start: {err}"
        newest = self.accepted[-1] if self.accepted else None
        assert self.newest_file_id() == newest, f"a refused upload is listed ({where})"
        assert self.stored_keys() == before_keys, f"a refused upload left an object ({where})"
        return err["code"]


def _uploader(api, base_url: str, state: AppState) -> Uploader:
    account_id, key = api.create_account()
    http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    return Uploader(http, state, account_id)


def _fuzz(uploader: Uploader, examples: int, *, derandomize: bool) -> Counter:
    outcomes: Counter = Counter()

    @settings(
        max_examples=examples, deadline=None, database=None, derandomize=derandomize, print_blob=True,
        phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck),
    )
    @given(jsonl_files())
    def run(generated):
        outcome = uploader.check(generated.purpose, generated.data)
        for kind in set(generated.kinds):
            event(f"line kind: {kind}")
        event(f"outcome: {outcome}")
        outcomes[outcome] += 1

    for case in explicit_files():
        run = example(case)(run)
    run()
    listed = uploader.http.get("/files", params={"limit": 10_000, "order": "asc"}).raise_for_status().json()
    assert [f["id"] for f in listed["data"]] == uploader.accepted, "GET /v1/files lists other files than the accepted"
    return outcomes


def _summary(name: str, outcomes: Counter, seconds: float) -> str:
    accepted = outcomes["accepted"]
    return (f"{name}: {sum(outcomes.values())} files in {seconds:.1f} s, {accepted} accepted, "
            f"{sum(outcomes.values()) - accepted} refused ({dict(sorted(outcomes.items()))}), 0 server errors")


PROFILES = [
    pytest.param("default", 1000, 40, id="default"),
    pytest.param("large", 2500, 400, id="large", marks=pytest.mark.fuzz_large),
]


@pytest.mark.parametrize("profile, local_examples, serve_examples", PROFILES)
def test_generated_files_sqlite(profile, local_examples, serve_examples, fuzz_api, fuzz_report):
    """Most generated files go to the in-process app (the same create_app, no Serve hop), a
    sample through the deployed Serve app; both share the deployment's database and store."""
    derandomize = profile == "default"  # make test is reproducible; the large profile explores
    started = time.monotonic()
    with serve_in_thread(fuzz_api.settings) as (base_url, state):
        local = _fuzz(_uploader(fuzz_api, base_url, state), local_examples, derandomize=derandomize)
        local_s = time.monotonic() - started
        served = _fuzz(_uploader(fuzz_api, fuzz_api.base_url, state), serve_examples, derandomize=derandomize)
    fuzz_report(_summary(f"uploads [{profile}, sqlite, in-process]", local, local_s))
    fuzz_report(_summary(f"uploads [{profile}, sqlite, Serve]", served, time.monotonic() - started - local_s))
    assert sum(local.values()) + sum(served.values()) >= 1000


@pytest.mark.fuzz_large
def test_generated_files_postgres(fuzz_pg_api, fuzz_report):
    started = time.monotonic()
    state = AppState.from_settings(fuzz_pg_api.settings)
    served = _fuzz(_uploader(fuzz_pg_api, fuzz_pg_api.base_url, state), 300, derandomize=False)
    with serve_in_thread(fuzz_pg_api.settings) as (base_url, local_state):
        local = _fuzz(_uploader(fuzz_pg_api, base_url, local_state), 1000, derandomize=False)
    fuzz_report(_summary("uploads [large, postgres, Serve + in-process]", served + local, time.monotonic() - started))


@pytest.mark.parametrize("large", [pytest.param(False, id="1MiB"), pytest.param(True, id="64MiB", marks=pytest.mark.fuzz_large)])
def test_size_edges_through_serve(large, fuzz_api, fuzz_report):
    """The line and file limits, each side of the edge, through the deployed app."""
    started = time.monotonic()
    uploader = _uploader(fuzz_api, fuzz_api.base_url, AppState.from_settings(fuzz_api.settings))
    outcomes = Counter()
    for label, purpose, data, expected in size_edges(large):
        outcome = uploader.check(purpose, data)
        assert outcome == expected, label
        outcomes[outcome] += 1
    fuzz_report(_summary(f"uploads [size edges{' to 64 MiB' if large else ' at 1 MiB'}, Serve]", outcomes,
                         time.monotonic() - started))
