"""The Train workers' placement groups of runs that were stopped.

Why this exists: Ray Train's controller actor creates a run's placement group (the bundles its
Train workers hold) and removes it when the run ends on its own. A run the job controller stops
(a cancel, the time limit, a stall, a lost lease) is killed with its task, and Ray Train's
controller, which that task owns, dies with it. Ray keeps a placement group until the *driver job*
that created it ends, so the bundle would stay reserved for as long as `openft serve` runs, and the
next job would wait for a Train worker that can never be placed. The group is recorded in the job's
row once the worker starts (`Job.run_placement_group`), and Ray Train's own cleaner learns it at the
same moment, so a run stopped during Ray Train's start (model load, worker startup) leaked it.

The GCS records each group's creator actor and whether that actor has died: a group of this driver
job (the service's own Ray job) whose creator is dead belongs to no live run, whatever the database
recorded. The group's flag is not always set: a Train controller that died with its owner (the run's
task, killed with the job controller's actor) was DEAD in the actor table while its group's
`creator_actor_dead` stayed false for as long as the service ran (.ci/run's fault suite, 2026-12-07,
once Ray Train's own `PlacementGroupCleaner` was no longer started: train/launcher.py), so the actor
table's word counts too. Groups of other Ray jobs on a shared cluster are never touched.
"""

from __future__ import annotations

import logging

log = logging.getLogger("openft.placement")


def remove_placement_group(pg_hex: str | None) -> None:
    """Remove a run's placement group if this cluster still has it (after a whole restart it is gone)."""
    if not pg_hex:
        return
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group as remove

    found = ray.util.placement_group_table().get(pg_hex)
    if found is not None and found.get("state") != "REMOVED":
        from ray._raylet import PlacementGroupID

        remove(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_hex))))
        log.info("removed the placement group of a stopped run")


def gcs_placement_groups() -> list:
    """The GCS's records of every placement group (`PlacementGroupTableData`): unlike
    `ray.util.placement_group_table()`, they keep the creator's actor, job and death."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    return [gcs_pb2.PlacementGroupTableData.FromString(raw)
            for raw in state._connect_and_get_accessor().get_placement_group_table()]


def orphaned_placement_groups() -> list[str]:
    """Hex ids of this Ray job's live placement groups whose creating actor has died."""
    import ray
    from ray.core.generated import gcs_pb2

    if not ray.is_initialized():
        return []
    job = bytes.fromhex(ray.get_runtime_context().get_job_id())
    removed = gcs_pb2.PlacementGroupTableData.REMOVED
    orphans = []
    for group in gcs_placement_groups():
        # A group made by the driver or a task has no creator actor and counts as "dead" in the GCS.
        made_by_actor = not ray.ActorID(group.creator_actor_id).is_nil()
        if (group.creator_job_id == job and made_by_actor and not group.is_detached and group.state != removed
                and (group.creator_actor_dead or _actor_dead(group.creator_actor_id))):
            orphans.append(group.placement_group_id.hex())
    return orphans


def _actor_dead(actor_id: bytes) -> bool:
    """Whether the actor table says the actor died for good (DEAD, not RESTARTING)."""
    import ray

    return (ray._private.state.actors(ray.ActorID(actor_id).hex()) or {}).get("State") == "DEAD"


def remove_orphans() -> int:
    """Remove every orphaned placement group (see the module's docstring); returns how many."""
    orphans = orphaned_placement_groups()
    for pg_hex in orphans:
        remove_placement_group(pg_hex)
    return len(orphans)
