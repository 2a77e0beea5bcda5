"""How a training run talks to its job: metrics, events and the owner's pause/cancel requests.

The recipes call a `Reporter` (the controller's DB-backed one, train/db_reporter.py, in the
service); `FileReporter` writes JSON lines and reads a control file, for tests, benches and
local runs. `Silent` is what the ranks other than 0 of a data-parallel run get: rank 0 reports
for the run (train/parallel.py). `MetricsClock` decides when a metrics report is due.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Protocol

METRIC_KEYS = ("step", "train_loss", "learning_rate", "tokens_per_second", "elapsed", "total_steps")
CONTROLS = (None, "pause", "cancel")


class Reporter(Protocol):
    def metrics(self, data: dict) -> None: ...

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        """`message` never contains row content: counts, codes and line numbers only."""
        ...

    def control(self) -> str | None:
        """None, "pause" or "cancel"."""
        ...


class Silent:
    """Reports nothing and is never asked for control: rank 0's answer is broadcast to it."""

    def metrics(self, data: dict) -> None:
        pass

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        pass

    def control(self) -> str | None:
        raise RuntimeError("only rank 0 polls for control; the loop broadcasts its answer")


class FileReporter:
    """Appends every metrics report and event to `log_path` as JSON lines; `control()` reads the
    text of `control_path` ("pause", "cancel" or absent). Picklable, so a Ray worker can build one."""

    def __init__(self, log_path: str | Path, control_path: str | Path | None = None):
        self.log_path = Path(log_path)
        self.control_path = Path(control_path) if control_path else None

    def _append(self, record: dict) -> None:
        with self.log_path.open("a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")

    def metrics(self, data: dict) -> None:
        self._append({"type": "metrics", "data": data})

    def event(self, message: str, *, level: str = "info", data: dict | None = None) -> None:
        self._append({"type": "event", "level": level, "message": message, "data": data})

    def control(self) -> str | None:
        if self.control_path is None or not self.control_path.exists():
            return None
        value = self.control_path.read_text().strip() or None
        if value not in CONTROLS:
            raise ValueError(f"control file holds {value!r}; write pause or cancel")
        return value

    def records(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]


class MetricsClock:
    """A metrics report is due every `every_steps` steps, or after `every_s` seconds without one."""

    def __init__(self, every_steps: int = 10, every_s: float = 10.0):
        self.every_steps = every_steps
        self.every_s = every_s
        self._last = time.monotonic()

    def due(self, step: int, total_steps: int) -> bool:
        now = time.monotonic()
        if step % self.every_steps == 0 or step == total_steps or now - self._last >= self.every_s:
            self._last = now
            return True
        return False
