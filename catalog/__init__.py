"""The base-model catalog: data about each fine-tuning base, shared by the API, pipelines, train and merge."""

from catalog.bases import BASES, BaseModelSpec, get_base

__all__ = ["BASES", "BaseModelSpec", "get_base"]
