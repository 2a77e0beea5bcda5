"""The Reporter a run uses: progress events, metrics and control requests go through the metadata
DB (the source of truth), so a restarted API or controller sees them.

Where it sits: the run's attempt task (train/attempt.py) and its Ray Train worker each build one
from the run's settings, job id and lease token. Every write stamps `progress_at` (the controller's
stall watchdog reads it) and is retried through a database outage for `db_outage_seconds`. A
control poll that finds the lease held by another run answers `lost`: the run stops and writes
nothing more.
"""

from __future__ import annotations

import time

from openft.settings import Settings
from storage.db import Database, is_transient
from storage.jobs import add_event, record_placement_group, touch_progress
from storage.models import Job

_LEVELS = {"info": "info", "warn": "warn", "warning": "warn", "error": "error"}


class DBReporter:
    """Picklable: holds settings, a job id and the run's lease token; opens its own DB connection
    where it is used."""

    def __init__(self, settings: Settings, job_id: str, owner: str | None = None, *, control_interval_s: float = 0.5):
        self.settings = settings
        self.job_id = job_id
        self.owner = owner
        self.control_interval_s = control_interval_s
        self._db: Database | None = None
        self._last_poll = 0.0
        self._last_control: str | None = None

    def __getstate__(self):
        return {"settings": self.settings, "job_id": self.job_id, "owner": self.owner,
                "control_interval_s": self.control_interval_s}

    def __setstate__(self, state):
        self.__init__(state["settings"], state["job_id"], state["owner"], control_interval_s=state["control_interval_s"])

    @property
    def db(self) -> Database:
        if self._db is None:
            self._db = Database(self.settings.resolved_database_url(), migrate=False)
        return self._db

    def _write(self, work, what: str) -> None:
        def once():
            with self.db.session() as session:
                work(session)
                touch_progress(session, self.job_id, int(time.time()))

        self.db.retrying(once, budget_s=self.settings.db_outage_seconds, what=what)

    def metrics(self, data: dict) -> None:
        now = int(time.time())
        step, total = data.get("step"), data.get("total_steps")
        loss = data.get("train_loss")
        message = f"Step {step}/{total}" + (f": training loss={loss:.4f}" if loss is not None else "")

        def work(session):
            add_event(session, self.job_id, now, message, type="metrics", data=data)
            job = session.get(Job, self.job_id)
            elapsed, rate = data.get("elapsed"), data.get("steps_per_second")
            if job is not None and job.status == "running" and step and total and elapsed:
                rate = rate or step / max(elapsed, 1e-6)
                job.estimated_finish = now + int((total - step) / max(rate, 1e-9))

        self._write(work, "metrics")

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self._write(lambda session: add_event(session, self.job_id, int(time.time()), message,
                                              level=_LEVELS.get(level, "info"), data=data), "event")

    def placement_group(self, pg_hex: str) -> None:
        """Record the run's Train placement group, while the run still holds the job's lease."""
        self._write(lambda session: record_placement_group(session, self.job_id, self.owner, pg_hex), "placement group")

    def control(self) -> str | None:
        """`pause` or `cancel` when the job's owner asked for it, `lost` when another run holds the
        job's lease; polled at most every interval. While the database is unreachable the last
        answer stands: an outage neither stops nor pauses a run."""
        if time.monotonic() - self._last_poll < self.control_interval_s:
            return self._last_control
        self._last_poll = time.monotonic()
        try:
            with self.db.session() as session:
                job = session.get(Job, self.job_id)
                if job is None or job.status == "cancelled" or job.control == "cancel":
                    self._last_control = "cancel"
                elif self.owner is not None and job.lease_owner != self.owner:
                    self._last_control = "lost"
                elif job.control == "pause":
                    self._last_control = "pause"
                else:
                    self._last_control = None
        except Exception as exc:
            if not is_transient(exc):
                raise
        return self._last_control
