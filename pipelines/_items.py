"""The one way this service's Ray Data stages start: a dataset over work items (byte ranges, shards,
batch lines), set up for a server rather than a notebook.

- One block per item unless told otherwise: each item is a unit of work that should be its own task.
- Resource reservation off: the default allocator keeps half of the CPUs back for operators that are
  not running yet; these stages run one operator at a time (validation ran one task at a time on a
  2-CPU node with it on, 2x slower).
- No progress bars: on a server nobody watches them, and every update of every bar is a line that
  the worker writes to its log (validation and the create checks had them off; tokenization,
  batches and distills had them on). Measured by process over a whole `make test`, this did not
  lower Ray's log monitor's share: it scans the session's log files at a steady rate, so its
  CPU follows the run's length, not these lines.
"""

from __future__ import annotations

from typing import Any


def item_dataset(items: list[dict[str, Any]], *, name: str | None, blocks: int | None = None):
    import ray

    ds = ray.data.from_items(items, override_num_blocks=max(1, len(items) if blocks is None else blocks))
    ds.context.op_resource_reservation_enabled = False
    ds.context.enable_progress_bars = False
    ds.set_name(name)
    return ds
