"""The Reporter a Ray Train worker uses: progress events, metrics and control requests go
through the metadata DB (the source of truth), so a restarted API or controller sees them."""

from __future__ import annotations

import time

from openft.settings import Settings
from storage.db import Database
from storage.jobs import add_event
from storage.models import Job

_LEVELS = {"info": "info", "warn": "warn", "warning": "warn", "error": "error"}


class DBReporter:
    """Picklable: holds settings and a job id; opens its own DB connection inside the worker."""

    def __init__(self, settings: Settings, job_id: str, *, control_interval_s: float = 0.5):
        self.settings = settings
        self.job_id = job_id
        self.control_interval_s = control_interval_s
        self._db: Database | None = None
        self._last_poll = 0.0
        self._last_control: str | None = None

    def __getstate__(self):
        return {"settings": self.settings, "job_id": self.job_id, "control_interval_s": self.control_interval_s}

    def __setstate__(self, state):
        self.__init__(state["settings"], state["job_id"], control_interval_s=state["control_interval_s"])

    @property
    def db(self) -> Database:
        if self._db is None:
            self._db = Database(self.settings.resolved_database_url(), migrate=False)
        return self._db

    def metrics(self, data: dict) -> None:
        now = int(time.time())
        step, total = data.get("step"), data.get("total_steps")
        loss = data.get("train_loss")
        message = f"Step {step}/{total}" + (f": training loss={loss:.4f}" if loss is not None else "")
        with self.db.session() as session:
            add_event(session, self.job_id, now, message, type="metrics", data=data)
            job = session.get(Job, self.job_id)
            elapsed, rate = data.get("elapsed"), data.get("steps_per_second")
            if job is not None and job.status == "running" and step and total and elapsed:
                rate = rate or step / max(elapsed, 1e-6)
                job.estimated_finish = now + int((total - step) / max(rate, 1e-9))

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        with self.db.session() as session:
            add_event(session, self.job_id, int(time.time()), message, level=_LEVELS.get(level, "info"), data=data)

    def control(self) -> str | None:
        """`pause` or `cancel` when the job's owner asked for it; polled at most every interval."""
        if time.monotonic() - self._last_poll < self.control_interval_s:
            return self._last_control
        self._last_poll = time.monotonic()
        with self.db.session() as session:
            job = session.get(Job, self.job_id)
            if job is None or job.status == "cancelled" or job.control == "cancel":
                self._last_control = "cancel"
            elif job.control == "pause":
                self._last_control = "pause"
            else:
                self._last_control = None
        return self._last_control
