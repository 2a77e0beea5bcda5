"""Waiting on a condition the system reaches by itself (a job's end, a run's stop)."""

from __future__ import annotations

import time


def until(check, what: str, timeout: float = 20, interval: float = 0.1):
    """`check()`'s first truthy value; AssertionError naming `what` if none within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"no {what} within {timeout} s")
