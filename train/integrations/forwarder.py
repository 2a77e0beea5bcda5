"""The forwarder: a Ray actor per job with integrations that tails the job's metrics events in
the database and hands them to its trackers, then the job's result once it has ended.

Where it sits: the controller's run thread calls `follow` when it starts a run of a job whose
spec has integrations (worker/runs.py, one line). Training never calls a tracker: a tracker
that hangs, raises or cannot reach its server touches only this actor, which records a
`warn`-level event (`integration_failed`, with the integration's type, the stage and the error's
class name, never a message or the job's data) and drops that tracker for the rest of the job.

The actor is detached and named after the job, so a controller that restarts leaves it running
and a later attempt's `follow` finds it (`get_if_exists`). It reads events in `seq` order from
where it left off, every `tracking_poll_seconds`, and ends itself once the job is `succeeded`,
`failed` or `cancelled` (a paused job keeps it waiting) or the job is gone. It reads the job's
status before its events, so the events written in the transaction that ended the job are read
before the result is sent. An actor lost with its node is started again by the job's next run,
which then sends the job's metrics again from the first step.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from jobs.integrations import WandbIntegration, from_wire
from jobs.spec import JobSpec
from openft.head_node import HEAD_NODE_RESOURCES
from openft.settings import Settings
from storage.db import Database, is_transient
from storage.jobs import ENDED_STATUSES, add_event, new_events
from storage.models import Job, JobEvent
from train.integrations.mlflow_tracker import MlflowTracker
from train.integrations.outcome import JobFacts, Outcome, numbers
from train.integrations.wandb_tracker import WandbTracker

log = logging.getLogger("openft.integrations")
STEP_SKIP = ("step",)  # the step is the metrics' x axis, not one of them


@dataclass(frozen=True)
class _Read:
    job: Job | None
    events: list[JobEvent]


class Forwarder:
    """One job's trackers, fed from the database; `poll` is one pass, `run` polls to the end."""

    def __init__(self, settings: Settings, job_id: str, *, db: Database | None = None):
        self.settings, self.job_id = settings, job_id
        self.db = db or Database(settings.resolved_database_url(), migrate=False)
        self.trackers: list | None = None  # built at the first pass, from the stored spec
        self.last_seq = 0

    def _read(self) -> _Read:
        with self.db.session() as session:
            job = session.get(Job, self.job_id)
            events = [] if job is None else list(new_events(session, self.job_id, self.last_seq, "metrics"))
            session.expunge_all()
            return _Read(job, events)

    def poll(self) -> bool:
        """Forward what is new; True once the job has ended (its result sent) or is gone."""
        read = self._read()
        if read.job is None:
            self.trackers = [t for t in self.trackers or [] if self._safely(t, "close", t.close)]
            return True
        if self.trackers is None:
            spec = JobSpec.from_record(read.job.spec)
            facts = JobFacts.of(self.job_id, spec)
            built = [self._tracker(from_wire(item), facts) for item in spec.integrations]
            self.trackers = [t for t in built if self._safely(t, "start", t.start)]
        rows = [(int(e.data["step"]), numbers(e.data, skip=STEP_SKIP)) for e in read.events
                if e.data and isinstance(e.data.get("step"), int)]
        if read.events:
            self.last_seq = read.events[-1].seq
        if rows:
            self.trackers = [t for t in self.trackers if self._safely(t, "log", lambda t=t: t.log(rows))]
        if read.job.status not in ENDED_STATUSES:
            return False
        job = read.job
        outcome = Outcome(status=job.status, trained_tokens=job.trained_tokens, fine_tuned_model=job.fine_tuned_model,
                          error_code=(job.error or {}).get("code"), figures=numbers(job.result))
        self.trackers = [t for t in self.trackers if self._safely(t, "finish", lambda t=t: t.finish(outcome))]
        return True

    def _tracker(self, config, facts: JobFacts):
        kind = WandbTracker if isinstance(config, WandbIntegration) else MlflowTracker
        return kind(config, facts, self.settings)

    def _safely(self, tracker, stage: str, call) -> bool:
        """Run one tracker call; on any failure warn in the job's events, stop the tracker's run, and
        answer False (the tracker is dropped). A tracker is a third party's code talking to a third
        party's server: whatever it raises must not stop the other trackers or the forwarder."""
        try:
            call()
            return True
        except Exception as exc:
            error = type(exc).__name__
            log.warning("%s integration of %s failed at %s: %s", tracker.kind, self.job_id, stage, error)
            if stage not in ("close", "finish"):
                try:
                    tracker.close()
                except Exception as again:
                    log.warning("%s integration of %s did not close: %s", tracker.kind, self.job_id, type(again).__name__)
            self._warn(tracker.kind, stage, error)
            return False

    def _warn(self, kind: str, stage: str, error: str) -> None:
        def work():
            with self.db.session() as session:
                if session.get(Job, self.job_id) is None:
                    return
                add_event(session, self.job_id, int(time.time()),
                          f"The {kind} integration stopped logging ({stage} failed: {error}); the job goes on without it.",
                          level="warn", data={"code": "integration_failed", "integration": kind, "stage": stage,
                                              "error": error})

        try:
            self.db.retrying(work, budget_s=self.settings.db_outage_seconds, what="integration warning")
        except Exception as exc:  # the database is gone for good: the log line above stays
            log.warning("integration warning of %s not recorded: %s", self.job_id, type(exc).__name__)

    def run(self, stop: threading.Event | None = None) -> None:
        """Poll until the job ends; rides through a database outage of up to `db_outage_seconds`."""
        stop = stop or threading.Event()
        down_since = None
        while not stop.is_set():
            try:
                if self.poll():
                    return
                down_since = None
            except Exception as exc:
                if not is_transient(exc):
                    log.error("forwarder of %s failed: %s", self.job_id, type(exc).__name__)
                    break
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > self.settings.db_outage_seconds:
                    log.error("forwarder of %s gave up: the database is unreachable", self.job_id)
                    break
            stop.wait(self.settings.tracking_poll_seconds)
        for tracker in self.trackers or []:
            self._safely(tracker, "close", tracker.close)


class _ForwarderActor:
    def __init__(self, settings: Settings, job_id: str):
        self.forwarder = Forwarder(settings, job_id)
        self.running = threading.Lock()

    def follow(self) -> None:
        import ray

        if not self.running.acquire(blocking=False):
            return  # a later attempt's `follow` while this one runs
        try:
            self.forwarder.run()
        finally:
            ray.actor.exit_actor()


def actor_name(job_id: str) -> str:
    return f"openft-track-{job_id}"


def follow(settings: Settings, job_id: str, spec: JobSpec) -> None:
    """Make sure a forwarder follows the job when its spec has integrations; never raises, so a
    tracking problem cannot stop the run that calls it."""
    if not spec.integrations:
        return
    try:
        import ray

        actor = ray.remote(num_cpus=0, resources=HEAD_NODE_RESOURCES, max_concurrency=2, max_restarts=0)(_ForwarderActor)
        handle = actor.options(name=actor_name(job_id), lifetime="detached", get_if_exists=True).remote(settings, job_id)
        handle.follow.remote()
    except Exception as exc:
        log.warning("forwarder of %s not started: %s", job_id, type(exc).__name__)
