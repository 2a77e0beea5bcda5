"""What `storage/leases.py` `lost_by_ray` counts as Ray losing the work (it runs again) and what as
the work's own end (recorded): Ray's own exception classes, chained the ways the drivers chain them."""

from __future__ import annotations

import pytest
import ray.exceptions as errors

from storage.leases import lost_by_ray


def _raised(first: BaseException, then: BaseException | None = None, *, how: str = "from") -> BaseException:
    """`then` raised from `first` (how="from"), while handling it ("context"), or with it hidden ("none")."""
    try:
        try:
            raise first
        except BaseException as exc:
            if then is None:
                raise
            if how == "from":
                raise then from exc
            if how == "none":
                raise then from None
            raise then  # noqa: B904 (the implicit chain is the point)
    except BaseException as out:
        return out


@pytest.mark.parametrize("exc", [
    errors.NodeDiedError("node"), errors.WorkerCrashedError(), errors.ActorDiedError(), errors.LocalRayletDiedError(),
    errors.OwnerDiedError("ab" * 28, None, ""), errors.RaySystemError("raylet"), errors.OutOfMemoryError("killed"),
    errors.RayTaskError("task", "tb", errors.WorkerCrashedError()),  # a task that awaited a lost one
    _raised(errors.NodeDiedError("node"), RuntimeError("the merge failed")),
    _raised(errors.NodeDiedError("node"), RuntimeError("a cleanup met the same Ray"), how="context"),
], ids=lambda e: type(e).__name__)
def test_ray_losing_a_process_or_node_is_lost(exc):
    assert lost_by_ray(exc)


@pytest.mark.parametrize("exc", [
    ValueError("the work's own"), errors.RayTaskError("task", "tb", ValueError("its code raised")),
    errors.TaskCancelledError(), errors.GetTimeoutError(), TimeoutError(),
    _raised(ValueError("own"), RuntimeError("wrapped")),
    _raised(errors.NodeDiedError("node"), RuntimeError("said unrelated"), how="none"),
], ids=lambda e: type(e).__name__)
def test_the_works_own_failure_a_timeout_or_a_cancel_is_not(exc):
    assert not lost_by_ray(exc)
