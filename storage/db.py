"""Engine and session factory for the metadata database (the source of truth for every object).

SQLite (WAL, a busy timeout so concurrent Serve replicas and Ray tasks wait instead of failing)
by default, PostgreSQL by URL. The schema is created and upgraded by Alembic (`storage/migrations`).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
log = logging.getLogger("openft.db")
T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """A failure that a retry can cure: the server restarted or a connection dropped (PostgreSQL),
    or the file is locked past the busy timeout (SQLite). Constraint and programming errors are not."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError))


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            # pysqlite opens transactions lazily and on its own; the "begin" hook below does it.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin_immediate(conn):
            # Take the write lock at BEGIN: read-then-write transactions (admission checks) would
            # otherwise deadlock-upgrade and fail with "database is locked" under concurrency.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def ping(url: str, timeout_s: float) -> None:
    """Connect once and run `SELECT 1`, giving up on a connection after `timeout_s` (a start-up
    check: `openft serve` refuses to start on a database it cannot reach). Raises SQLAlchemy's error."""
    if url.startswith("sqlite"):
        engine = make_engine(url)
    else:
        engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": max(1, round(timeout_s))})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    finally:
        engine.dispose()


def describe_url(url: str) -> str:
    """The URL as an operator may see it on the console: its password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return "(not a SQLAlchemy URL)"


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        # "heads": migrations written on parallel branches each revise the same parent until they are
        # chained; every branch's head is applied.
        command.upgrade(cfg, "heads")


class Database:
    """An engine plus a session factory; built from a URL at an entry point and passed in."""

    def __init__(self, url: str, *, migrate: bool = True):
        self.url = url
        self.engine = make_engine(url)
        if migrate:
            upgrade(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits on success, rolls back on any exception (and re-raises it)."""
        with self._sessions() as s:
            with s.begin():
                yield s

    def retrying(self, work: Callable[[], T], *, budget_s: float, what: str) -> T:
        """Run `work` (which opens its own sessions), retrying transient failures with backoff for up to
        `budget_s`: a database restart mid-run is ridden through instead of failing the job."""
        deadline, delay = time.monotonic() + budget_s, 0.2
        while True:
            try:
                return work()
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: database unavailable (%s), retrying in %.1f s", what, type(exc).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def dispose(self) -> None:
        self.engine.dispose()
