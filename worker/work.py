"""What the worker's tick asks of each kind of background work (worker/controller.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from storage.leases import Kind


@dataclass(frozen=True)
class Task:
    """One claim to drive: the row, the lease token that proves it, and what drives it (on a thread)."""

    row_id: str
    owner: str
    run: Callable[[], None]


class Work(Protocol):
    """One kind of background work, as the controller's tick runs it: `reconcile` loses what nothing
    drives (storage/leases.py `reconcile` with the kind's `lose`) and returns the ids of the rows
    lost; `claim` claims what may start now, each claim under a token of
    `leases.new_owner(controller id, kind)`, and returns a task per claim, whose `run` drives it
    under a `Heartbeat`. The tick calls both only while the kind has a row they could act on
    (`Kind.due`). `sweep` cleans up after work that ended (objects, stages, placement groups): it
    runs every `controller_sweep_seconds`, whether or not the kind has rows due."""

    kind: Kind

    def reconcile(self, now: int, alive: set[str], mine: str) -> list[str]: ...

    def claim(self, now: int) -> list[Task]: ...

    def sweep(self, now: int) -> None: ...
