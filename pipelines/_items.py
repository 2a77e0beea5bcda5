"""The one way this service's Ray Data stages start: a dataset over work items (byte ranges, shards,
batch lines), set up for a server rather than a notebook.

- One block per item unless told otherwise: each item is a unit of work that should be its own task.
- Resource reservation off: the default allocator keeps half of the CPUs back for operators that are
  not running yet; these stages run one operator at a time (validation ran one task at a time on a
  2-CPU node with it on, 2x slower).
- No progress bars: on a server nobody watches them, and every update of every bar is a line that
  the worker writes and Ray's log monitor reads and forwards (measured: Ray's log monitor was among
  the ten busiest processes of `make test` before they were turned off here).
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
