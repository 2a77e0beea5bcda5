"""A run that trains nothing but speaks the real run protocol, for tests of the controller's
scheduling, leases and supervision that would otherwise need hundreds of Ray Train starts.

It is the seam `Controller(runs=...)` takes; everything around it is real: the controller, the
transitions, the database, the ledger, and the run's side of the protocol (`DBReporter`: metrics
that stamp progress, control polls that prove the lease). A scripted run steps `steps` times,
stops on `cancel`, `lost` and `pause` as the training loop does, and on success writes an adapter
in the format registration checks. Real training runs the same controller in tests/serve_app and
tests/faults.
"""

from __future__ import annotations

import threading
import time

import orjson

from storage import keys
from storage.objects import open_object_store
from train.attempt import AttemptResult, RunTicket
from train.db_reporter import DBReporter


class ScriptedRun:
    def __init__(self, ticket: RunTicket, *, steps: int, step_s: float, hang: bool, crash: bool, lose: bool = False):
        self.ticket = ticket
        self.steps, self.step_s, self.hang, self.crash, self.lose = steps, step_s, hang, crash, lose
        self.aborted = threading.Event()
        self.done = threading.Event()
        self.result: AttemptResult | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._steps()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _steps(self) -> AttemptResult:
        t = self.ticket
        reporter = DBReporter(t.settings, t.job_id, t.owner, control_interval_s=0)
        try:
            for step in range(1, self.steps + 1):
                if self.aborted.is_set():
                    return AttemptResult("cancelled")
                control = reporter.control()
                if control in ("cancel", "lost"):
                    return AttemptResult("cancelled")
                if control == "pause":
                    return AttemptResult("paused")
                if self.hang:  # a hung step: no progress until the controller aborts it
                    self.aborted.wait()
                    return AttemptResult("cancelled")
                reporter.metrics({"step": step, "total_steps": self.steps, "train_loss": 1.0 / step})
                time.sleep(self.step_s)
            if self.crash:
                raise RuntimeError("the run's process died")
            if self.lose:  # what RayRun.wait answers when Ray lost the task (its worker or node died)
                return AttemptResult("lost")
            store = open_object_store(t.settings.resolved_storage_url())
            prefix = keys.adapter(t.job_id)
            store.put_bytes(prefix + "adapter_model.safetensors", b"\0" * 64)
            store.put_bytes(prefix + "adapter_config.json", orjson.dumps({"peft_type": "LORA", "r": 8}))
            return AttemptResult("succeeded", result={"trained_tokens": 1000 * self.steps, "steps": self.steps})
        finally:
            reporter.db.dispose()

    def wait(self, timeout: float) -> AttemptResult | None:
        if not self.done.wait(timeout):
            return None
        if self.error is not None:
            raise self.error
        return self.result

    def abort(self) -> None:
        self.aborted.set()


class ScriptedRuns:
    """Launches scripted runs and keeps every ticket it was given (what the controller handed a run)."""

    def __init__(self, *, steps: int = 5, step_s: float = 0.02, hang: bool = False, crash: bool = False,
                 lose: bool = False):
        self.steps, self.step_s, self.hang, self.crash, self.lose = steps, step_s, hang, crash, lose
        self.tickets: list[RunTicket] = []
        self.launched: list[ScriptedRun] = []

    def launch(self, ticket: RunTicket) -> ScriptedRun:
        self.tickets.append(ticket)
        run = ScriptedRun(ticket, steps=self.steps, step_s=self.step_s, hang=self.hang, crash=self.crash,
                          lose=self.lose)
        self.launched.append(run)
        return run
