"""Session fixtures for merge tests: one stand-in cache and one trained adapter, shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.bases import get_base
from catalog.standins import standin_dir
from tests.merge.builders import Adapter, train_adapter


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "merge-model-cache"


@pytest.fixture(scope="session")
def qwen7b(model_cache):
    base = get_base("qwen2.5-7b-instruct")
    return base, standin_dir(base, model_cache)


@pytest.fixture(scope="session")
def qwen7b_adapter(qwen7b, tmp_path_factory) -> Adapter:
    base, directory = qwen7b
    return train_adapter(directory, base, tmp_path_factory.mktemp("adapters"))

