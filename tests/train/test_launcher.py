"""train/launcher.py's trainer: Ray Train's own callbacks, less the datasets one for a run given no
datasets (issue 23: a `DatasetManager` actor per run that such a run never asks for a shard)."""

from __future__ import annotations

import pytest


def _callbacks(trainer_cls, tmp_path, datasets):
    import ray.train

    trainer = trainer_cls(lambda config: None, scaling_config=ray.train.ScalingConfig(num_workers=1),
                          run_config=ray.train.RunConfig(name="callbacks", storage_path=str(tmp_path)),
                          datasets=datasets)
    return {type(callback).__name__ for callback in trainer._create_default_callbacks()}


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_without_datasets_starts_no_dataset_manager_and_one_with_them_keeps_it(tmp_path):
    import ray.data
    from ray.train.torch import TorchTrainer

    from train.launcher import trainer_class

    stock = _callbacks(TorchTrainer, tmp_path, None)
    assert "DatasetsCallback" in stock  # what Ray Train 2.60 adds to every run, datasets or not
    assert _callbacks(trainer_class(), tmp_path, None) == stock - {"DatasetsCallback"}
    rows = {"train": ray.data.from_items([{"line": 0}])}
    assert _callbacks(trainer_class(), tmp_path, rows) == _callbacks(TorchTrainer, tmp_path, rows) == stock
