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
