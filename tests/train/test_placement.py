"""Placement groups of stopped runs (train/placement.py) on the session's real Ray cluster: a group
whose creating actor was killed is found and removed, and its CPU is free again; a live actor's
group and the driver's own are never touched."""

from __future__ import annotations

import pytest

from tests.utils.polling import until
from train.placement import orphaned_placement_groups, remove_orphans

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _maker():
    import ray

    @ray.remote(num_cpus=0)
    class Maker:  # stands in for Ray Train's controller actor, which creates a run's group
        def make(self) -> str:
            from ray.util.placement_group import placement_group

            group = placement_group([{"CPU": 0.25}])
            ray.get(group.ready())
            return group.id.hex()

    return Maker.remote()


def _state(pg_hex: str) -> str:
    import ray

    return ray.util.placement_group_table()[pg_hex]["state"]


def test_a_group_whose_creator_died_is_removed_and_the_others_stay():
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    free_before = ray.available_resources().get("CPU", 0)
    doomed, living = _maker(), _maker()
    doomed_pg, living_pg = ray.get(doomed.make.remote()), ray.get(living.make.remote())
    driver_pg = placement_group([{"CPU": 0.25}])
    ray.get(driver_pg.ready())
    try:
        assert orphaned_placement_groups() == []  # every creator is alive
        ray.kill(doomed)  # as a stopped run's task takes Ray Train's controller with it
        until(lambda: orphaned_placement_groups() == [doomed_pg], "the dead creator's group to show", 30)
        assert _state(doomed_pg) == "CREATED"  # Ray alone keeps it for the driver's lifetime
        assert remove_orphans() == 1
        assert _state(doomed_pg) == "REMOVED"
        assert (_state(living_pg), _state(driver_pg.id.hex())) == ("CREATED", "CREATED")
        assert remove_orphans() == 0
    finally:
        ray.kill(living)
        remove_placement_group(driver_pg)
        until(lambda: remove_orphans() or _state(living_pg) == "REMOVED", "the living group's sweep", 30)
    until(lambda: ray.available_resources().get("CPU", 0) == free_before, "the CPUs to be free again", 30)


def test_a_group_whose_creator_died_with_its_owner_task_is_removed():
    """The run's shape: a task (a job's attempt) owns the actor (Ray Train's controller) that made
    the group; the task is killed, and the actor dies with its owner. Here the GCS marks the creator
    dead, so this passes on the group's flag alone; in .ci/run's fault suite the flag once stayed
    false, which the sweep's reading of the actor table covers (train/placement.py)."""
    import ray

    @ray.remote(num_cpus=0)
    def attempt(ready):
        maker = _maker()
        ray.get(ready.put.remote(ray.get(maker.make.remote())))
        import time

        time.sleep(600)  # the run goes on until it is killed

    @ray.remote(num_cpus=0)
    class Box:
        def __init__(self):
            self.value = None

        def put(self, value):
            self.value = value

        def get(self):
            return self.value

    free_before = ray.available_resources().get("CPU", 0)
    box = Box.remote()
    task = attempt.remote(box)
    pg_hex = until(lambda: ray.get(box.get.remote()), "the task's actor to make its group", 60)
    assert pg_hex not in orphaned_placement_groups()  # its creator is alive
    ray.cancel(task, force=True)  # as the job controller's actor takes its run's task with it
    until(lambda: pg_hex in orphaned_placement_groups(), "the group of the creator that died with its owner", 60)
    assert remove_orphans() >= 1
    assert _state(pg_hex) == "REMOVED"
    ray.kill(box)
    until(lambda: ray.available_resources().get("CPU", 0) == free_before, "the CPUs to be free again", 30)
