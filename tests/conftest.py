"""Session-wide real infrastructure: one local Ray cluster, one Ray Serve instance, and the API
deployed twice on it: over SQLite + local objects and over PostgreSQL (127.0.0.1:5432) + local
objects. API tests take the `api` fixture and run against both."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from entrypoints.ray_runtime import prepare_ray_environment
from openft.settings import Settings
from tests.utils.ports import free_port  # noqa: F401  (the suite's one home for ports)

# Short and outside pytest's deep tmp paths: Ray keeps unix sockets under it. Prepared at import,
# before any test module imports ray: Ray reads its auth mode once, at import.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="oft-"))
RAY_SETTINGS = Settings(data_dir=SESSION_DIR / "ray-home")
prepare_ray_environment(RAY_SETTINGS)

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The suite's deployments run unthrottled: tests (and fuzzers) make many quick calls from one key.
# tests/serve_app/test_rate_limits.py deploys its own with limits on.
RATE_LIMITS_OFF = {"rate_limit_requests_per_second": 0, "rate_limit_heavy_per_second": 0, "uploads_in_flight_per_account": 0,
                   "rate_limit_generations_per_second": 0, "online_generations_per_account": 0}
# Online serving (issue 27) of the one base the tests chat with; its deployment has no replica until
# a test sends it a request.
ONLINE_TEST_BASES = {"online_bases": ["qwen2.5-0.5b-instruct"]}
# The python graders' sandbox with small limits, so that the escape tests end in seconds (OpenAI's
# 2 minutes, 2 GB and 1 GB are the settings' defaults).
# The wall limit stays well above the CPU limit: on a loaded machine 1 CPU-second takes many.
SANDBOX_TEST_LIMITS = {"grader_python_wall_seconds": 20, "grader_python_cpu_seconds": 1,
                       "grader_python_memory_bytes": 512 * 2**20, "grader_python_disk_bytes": 4 * 2**20,
                       "grader_python_max_processes": 32}
# The webhook tests' receivers listen on 127.0.0.1, which the address rule refuses by default
# (webhooks/targets.py): the suite's deployments allow that one address and nothing else, so no
# test can reach another. tests/webhooks/test_targets.py shows the default refusing it.
LOOPBACK_RECEIVERS = {"webhook_allowed_networks": ["127.0.0.1/32"]}


def postgres_reachable() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def session_dir() -> Path:
    yield SESSION_DIR
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def seaweed(session_dir: Path):
    """One real S3-compatible server (SeaweedFS, 127.0.0.1, telemetry off) for the session.

    Its credentials go into the environment before Ray starts (`ray_cluster` depends on this), so
    Ray's workers find them through boto3's and pyarrow's own credential chains, as a production
    node finds its own; library code never reads them."""
    from tests.utils.seaweed import start_seaweed

    server = start_seaweed(session_dir / "seaweed")
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = server.access_key, server.secret_key
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def ray_cluster(session_dir: Path, seaweed):
    import ray

    from entrypoints.ray_runtime import start_ray

    start_ray(RAY_SETTINGS, dashboard=False, num_cpus=2)
    yield ray
    ray.shutdown()


@contextmanager
def _new_pg_database(prefix: str):
    """A fresh PostgreSQL database, dropped on exit; skips the test when no server is reachable."""
    if not postgres_reachable():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432: the PostgreSQL runs are skipped")
    import sqlalchemy as sa

    def admin(sql: str) -> None:
        # A connection of its own each time: a test may restart the server in between.
        engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
        engine.dispose()

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin(f"CREATE DATABASE {name}")
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pg_database_url():
    """A fresh PostgreSQL database for this session, dropped at the end."""
    with _new_pg_database("openft_test") as url:
        yield url


@pytest.fixture
def fresh_pg_url():
    """A PostgreSQL database of the test's own, dropped after it."""
    with _new_pg_database("openft_t") as url:
        yield url


@dataclass
class Api:
    """A deployed API: its settings (to reach its DB and store directly) and base URL."""

    name: str
    settings: Settings
    base_url: str

    def client(self, key: str, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, **kw)

    def create_account(self, name: str | None = None, open_jobs: int = 1) -> tuple[str, str]:
        """Returns (account id, key), made through the same repository the CLI uses."""
        from storage.accounts import create_account
        from storage.db import Database

        db = Database(self.settings.resolved_database_url())
        try:
            with db.session() as session:
                account, key = create_account(session, name or f"acct-{uuid.uuid4().hex[:8]}", open_jobs_limit=open_jobs)
                return account.id, key
        finally:
            db.dispose()


@pytest.fixture(scope="session")
def serve_port(ray_cluster) -> int:
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()


def _deploy(name: str, settings: Settings, port: int) -> Api:
    from entrypoints.ray_runtime import deploy_api

    base_url = deploy_api(settings, host="127.0.0.1", port=port, name=name, route_prefix=f"/{name}")
    return Api(name=name, settings=settings, base_url=base_url)


@pytest.fixture(scope="session")
def apis(request, session_dir: Path, serve_port: int):
    """Deploys an API per backend on first use: apis("sqlite"), apis("postgres"); settings
    overrides apply at a name's first use: apis("billing", billing_enabled=True)."""
    deployed: dict[str, Api] = {}

    def get(name: str, **settings_overrides) -> Api:
        if name not in deployed:
            overrides = {"model_source": "standin", "controller_poll_seconds": 0.3, **RATE_LIMITS_OFF, **LOOPBACK_RECEIVERS,
                         **SANDBOX_TEST_LIMITS, **ONLINE_TEST_BASES, **settings_overrides}
            if name == "postgres":
                overrides["database_url"] = request.getfixturevalue("pg_database_url")
            settings = Settings(data_dir=session_dir / f"api-{name}", **overrides)
            deployed[name] = _deploy(name, settings, serve_port)
        return deployed[name]

    return get


ADMIN_KEY = "admin-test-key-0123456789"


@pytest.fixture(scope="session")
def admin_api(apis) -> Api:
    """The deployment with an admin key (`ADMIN_KEY`), billing on, public API docs and a public base
    URL for redirects: one, shared by the billing and API-surface tests, since each deployment costs
    tens of seconds on a busy machine."""
    return apis("billing", billing_enabled=True, admin_key=ADMIN_KEY, api_docs_public=True,
                public_base_url="https://ft.example.com/openft", **ONLINE_TEST_LIMITS)  # fmt: skip


def _online_test_prices():
    from openft.pricing import DEFAULT_RATES, BaseRate, PriceTable

    rate = BaseRate(supervised_usd_per_mtok=0.40, dpo_usd_per_mtok=0.80, online_usd_per_mtok=1000.0)
    return PriceTable(rates={**DEFAULT_RATES, "qwen2.5-0.5b-instruct": rate})


# The billing deployment also answers chat completions (tests/serve_app/test_chat_api.py) under small
# limits: two adapters per replica (four fine-tunes evict), 8 generations per account at once, a
# generation bucket of 30 refilled at 1 a second, and an online rate of 1,000 USD per million tokens
# on the test base (a tenth of a cent a token: a few short answers charge whole cents).
ONLINE_TEST_LIMITS = {"online_adapters_per_replica": 2, "online_generations_per_account": 8,
                      "rate_limit_generations_per_second": 1, "rate_limit_generations_burst": 30,
                      "prices": _online_test_prices()}


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def api(request, apis) -> Api:
    return apis(request.param)


@pytest.fixture(scope="session")
def training_api(apis) -> Api:
    """A SQLite deployment of its own with a running job controller: training runs are costly on
    2 cores, so end-to-end training tests run once, and the controller's passes (jobs, merges)
    must not race tests that drive the DB directly on the other deployments."""
    return apis("training")


@pytest.fixture(scope="session")
def controller(training_api: Api):
    """The real job controller actor for the training deployment."""
    import ray

    from worker.controller import start_controller

    handle = start_controller(training_api.settings, name=f"controller-{uuid.uuid4().hex[:6]}")
    yield handle
    ray.get(handle.stop.remote())
    ray.kill(handle)


@pytest.fixture
def account(api: Api):
    """A fresh account on the API under test: (client, account id, key)."""
    account_id, key = api.create_account()
    return api.client(key), account_id, key


def redeploy(api: Api, port: int) -> Api:
    """Delete the Serve application and deploy it again from the same settings (a restart)."""
    from ray import serve

    serve.delete(api.name)
    return _deploy(api.name, api.settings, port)


# Tests run on both databases whose PostgreSQL run (where locks and restarts really matter) stays
# in make test; their SQLite run goes to make test-heavy, for make test's 12-minute budget.
HEAVY_VARIANTS = {
    "tests/serve_app/test_jobs_api.py::test_jobs_survive_a_restart[sqlite]",
    "tests/serve_app/test_files_api.py::test_files_survive_a_restart[sqlite]",
    "tests/worker/test_controller.py::test_one_pass_starts_one_run_for_two_accounts_under_the_default_cap[sqlite]",
}


# make test, make test-heavy, make test-fuzz and make test-heavy-fuzz run on two xdist workers, a
# file at a time (--dist loadfile --no-loadscope-reorder): the files that take longest in that
# target go first, so that the two workers end together instead of one waiting out a long file
# started last. The rest keep their collection order. Keyed by the target's -m expression ("" for
# make test's, from pyproject.toml).
FIRST_FILES = {
    "": (
        "tests/serve_app/test_training_control.py",
        "tests/serve_app/test_jobs_api.py",
        "tests/serve_app/test_training_api.py",
        "tests/worker/test_controller.py",
        "tests/serve_app/test_upload_hardening.py",
        "tests/test_cli.py",
    ),
    "heavy": (
        "tests/serve_app/test_rft_chain.py",
        "tests/bench/test_gpu_check.py",
        "tests/serve_app/test_batches_e2e.py",
        "tests/train/test_ddp.py",
        "tests/train/integrations/test_tracking_job.py",
        "tests/serve_app/test_training_control.py",
        "tests/serve_app/test_training_api.py",
        "tests/test_cli.py",
        "tests/train/test_train_storage.py",
        "tests/pipelines/test_s3_pipelines.py",
        "tests/worker/test_deliveries.py",
    ),
    "fuzz_large": (
        "tests/fuzz/test_schema_fuzz.py",
        "tests/fuzz/test_upload_fuzz.py",
        "tests/fuzz/test_header_fuzz.py",
    ),
}
# make test-faults runs a test at a time on whichever worker is free (--dist load): its tests, not
# its files, go longest first (each test's seconds in issue 23's note), so that the short ones fill
# the end. A name here without its parameters ranks every parametrized case of it.
FIRST_FILES["faults"] = tuple(f"tests/faults/{test}" for test in (
    "test_background_faults.py::test_sigkill_mid_batch_merge_distill_and_delivery_then_a_restart_ends_each_once",
    "test_faults.py::test_sigkill_of_the_serve_process_group_then_a_restart_finishes_the_job_once",
    "test_faults.py::test_sigkill_of_the_train_worker_mid_rft_resumes_to_the_uninterrupted_runs_adapter",
    "test_background_faults.py::test_ray_kill_of_the_controller_mid_eval_run_hands_it_over",
    "test_faults.py::test_a_hung_train_worker_is_stopped_by_the_stall_watchdog",
    "test_background_faults.py::test_ray_kill_of_the_controller_mid_batch_and_mid_merge_hands_both_over",
    "test_faults.py::test_ray_kill_of_the_controller_actor_mid_run_resumes_scheduling_and_the_job_finishes",
    "test_faults.py::test_sigkill_of_the_train_worker_mid_step_resumes_from_its_checkpoint",
    "test_background_faults.py::test_postgres_restarted_mid_batch_and_mid_merge_both_end_once",
    "test_faults.py::test_postgres_restarted_mid_job_is_ridden_through",
    "test_faults.py::test_s3_stopped_mid_run_and_started_again_never_succeeds_without_its_adapter",
    "test_faults.py::test_a_train_worker_lost_twice_fails_platform_interrupted",
))
# make test-heavy-fuzz (.ci/run): both suites' long files, longest first (each file's seconds in
# the two targets' runs of issue 23's note).
FIRST_FILES["heavy or fuzz_large"] = (
    "tests/serve_app/test_rft_chain.py",
    "tests/serve_app/test_batches_e2e.py",
    "tests/fuzz/test_schema_fuzz.py",
    "tests/fuzz/test_upload_fuzz.py",
    "tests/train/test_ddp.py",
    "tests/bench/test_gpu_check.py",
    "tests/train/integrations/test_tracking_job.py",
    "tests/test_cli.py",
    "tests/fuzz/test_header_fuzz.py",
    "tests/fuzz/test_multipart_fuzz.py",
    "tests/serve_app/test_training_api.py",
    "tests/pipelines/test_s3_pipelines.py",
    "tests/worker/test_deliveries.py",
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in HEAVY_VARIANTS:
            item.add_marker(pytest.mark.heavy)
    missing = [path for paths in FIRST_FILES.values() for path in paths if not (ROOT / path.split("::")[0]).exists()]
    assert not missing, f"FIRST_FILES names files that are gone: {missing}"
    first = FIRST_FILES.get(config.getoption("markexpr"), FIRST_FILES[""])
    rank = {path: i for i, path in enumerate(first)}
    named = {item.nodeid.split("[", 1)[0] for item in items}
    files = {test.split("::", 1)[0] for test in named}
    gone = [test for test in first if "::" in test and test.split("::", 1)[0] in files and test not in named]
    assert not gone, f"FIRST_FILES names tests that are gone: {gone}"

    def order(item) -> int:
        test = item.nodeid.split("[", 1)[0]
        return rank.get(test, rank.get(test.split("::", 1)[0], len(rank)))

    items.sort(key=order)  # stable: the rest keep their order


# -- the fuzzers' summary (tests/fuzz/conftest.py `fuzz_report`) -----------------------------------
# Kept here, in the conftest every process loads: under xdist the controller collects nothing, so
# its summary is made of the lines each worker sends back when it ends.
FUZZ_SUMMARY: list[str] = []


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzz_summary"] = list(FUZZ_SUMMARY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    FUZZ_SUMMARY.extend(getattr(node, "workeroutput", {}).get("fuzz_summary", []))


def pytest_terminal_summary(terminalreporter):
    if FUZZ_SUMMARY:
        terminalreporter.section("fuzz summary")
        for line in FUZZ_SUMMARY:
            terminalreporter.write_line(line)
