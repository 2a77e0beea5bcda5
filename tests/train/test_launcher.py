"""train/launcher.py's trainer: Ray Train's own callbacks, less the placement group cleaner's (the job
controller's sweep removes a stopped run's group: tests/train/test_placement.py) and, for a run given
no datasets, the datasets one (issue 23: a helper actor per run, a process each, that such a run
never needs); and for one worker Ray Train's plain backend in place of torch's process group."""

from __future__ import annotations

import pytest


def _callbacks(trainer_cls, tmp_path, datasets):
    import ray.train

    trainer = trainer_cls(lambda config: None, scaling_config=ray.train.ScalingConfig(num_workers=1),
                          run_config=ray.train.RunConfig(name="callbacks", storage_path=str(tmp_path)),
                          datasets=datasets)
    return {type(callback).__name__ for callback in trainer._create_default_callbacks()}


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_starts_no_placement_group_cleaner_and_no_dataset_manager_unless_given_datasets(tmp_path):
    import ray.data
    from ray.train.torch import TorchTrainer

    from train.launcher import trainer_class

    stock = _callbacks(TorchTrainer, tmp_path, None)
    # What Ray Train 2.60 adds to every run, datasets or not.
    assert {"DatasetsCallback", "PlacementGroupCleanerCallback"} <= stock
    assert _callbacks(trainer_class(), tmp_path, None) == stock - {"DatasetsCallback", "PlacementGroupCleanerCallback"}
    assert _callbacks(trainer_class(2), tmp_path, None) == stock - {"DatasetsCallback", "PlacementGroupCleanerCallback"}
    rows = {"train": ray.data.from_items([{"line": 0}])}
    assert _callbacks(TorchTrainer, tmp_path, rows) == stock
    assert _callbacks(trainer_class(), tmp_path, rows) == stock - {"PlacementGroupCleanerCallback"}


def test_one_worker_takes_no_torch_process_group_and_several_take_torchs(tmp_path):
    """A one-worker run does no collective (train/parallel.py SINGLE): its backend is Ray Train's plain
    one, so its controller unpickles no TorchConfig and never imports torch; two workers get torch's."""
    import ray.train
    from ray.train.backend import BackendConfig
    from ray.train.torch import TorchConfig

    from train.launcher import trainer_class

    def backend(workers: int):
        run = ray.train.RunConfig(name="backend", storage_path=str(tmp_path))
        scaling = ray.train.ScalingConfig(num_workers=workers)
        return trainer_class(workers)(lambda config: None, scaling_config=scaling, run_config=run).backend_config

    assert type(backend(1)) is BackendConfig
    assert isinstance(backend(2), TorchConfig)
