"""Deployments and reporting for the fuzzers.

`fuzz_api` is a SQLite deployment of its own (the default profile); `fuzz_pg_api` a PostgreSQL
one with an admin key (the large profile, `make test-fuzz`). `local_app` serves the same
`create_app(settings)` with uvicorn in a thread of the test process: the bulk of the generated
uploads go there (no Serve hop, so a thousand files fit in `make test`) and a sample goes
through the deployed Serve app. Each fuzzer records its case counts with `fuzz_report`; they are
printed at the end of the run."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pytest
import uvicorn

from openft.settings import Settings
from serve_app.app import create_app
from serve_app.state import AppState
from storage import keys
from tests.conftest import FUZZ_SUMMARY, Api, _new_pg_database, free_port
from tests.utils.polling import until

FUZZ_ADMIN_KEY = "fuzz-admin-key-0123456789abcdef"
ENVELOPE_KEYS = {"message", "type", "param", "code"}  # OpenAI's error object, every refusal's shape


# The large profile accepts thousands of files into one account, past the per-account file limit
# (1,000 by default), whose refusals tests/serve_app/test_upload_hardening.py covers.
FUZZ_LIMITS = {"account_max_files": 1_000_000}


@pytest.fixture(scope="session")
def fuzz_api(apis) -> Api:
    return apis("fuzz", **FUZZ_LIMITS)


@pytest.fixture(scope="session")
def fuzz_pg_database_url():
    with _new_pg_database("openft_fuzz") as url:
        yield url


@pytest.fixture(scope="session")
def fuzz_pg_api(apis, fuzz_pg_database_url) -> Api:
    """PostgreSQL, with the admin API on: the large profile fuzzes the admin routes too."""
    return apis("fuzz-pg", database_url=fuzz_pg_database_url, admin_key=FUZZ_ADMIN_KEY, **FUZZ_LIMITS)


@contextmanager
def serve_in_thread(settings: Settings, http="auto") -> Iterator[tuple[str, AppState]]:
    """The API app on uvicorn in a daemon thread: (base URL ending in /v1, the app's state). `http`:
    uvicorn's protocol (the Serve proxy's bounded one: entrypoints/serve_proxy.py)."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                           http=http))
    thread = threading.Thread(target=server.run, name="fuzz-uvicorn", daemon=True)
    thread.start()
    try:
        until(lambda: server.started, "local uvicorn start", timeout=60)
        yield f"http://127.0.0.1:{port}/v1", app.state.openft
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def stored_keys(state: AppState, account_id: str) -> set[str]:
    """The account's objects under the uploads prefix (storage/keys.py)."""
    return set(state.store.list(keys.upload(account_id, "")))


@pytest.fixture(scope="session")
def fuzz_report():
    """fuzz_report(line): a summary line printed after the run (case counts, durations; tests/conftest.py)."""
    return FUZZ_SUMMARY.append

