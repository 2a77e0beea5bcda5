"""What the GPU check's stages share (bench/gpu_check.py): the context a stage gets, the sizes of
the GPU run and of the CPU smoke, how a stage or a part of one is skipped, peak memory.

Standard library only at import: the install stage runs before anything else is importable.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path

BASE_ID = "qwen2.5-7b-instruct"  # the catalog base whose real shape the check trains

# Sizes of the GPU run (`gpu`) and of the CPU smoke (`tiny`, on a stand-in of the same config
# scaled down: catalog/standins.py's dimensions and vocabulary).
_GPU = dict(
    batch_size=8, sft_steps=30, median_tokens=300, max_seq_length=1024,
    long_seq=8192, long_tokens=7800, long_batch=2, long_steps=4,
    qlora_steps=10, dpo_steps=10, dpo_batch=4,
    batch_rows_per_adapter=16, batch_max_tokens=64, batch_max_rows=16,
    parity_prompts=4, parity_max_tokens=16, parity_tolerance=0.5,
    validate_mib=64, distill_results=100_000, ray_caps=(1, 4, 16), ray_repeats=2,
    allreduce_repeats=10,
)  # fmt: skip
PROFILES = {
    "gpu": _GPU,
    # Rows of SFT's lengths and long rows still above 2,048 tokens; everything else small.
    "tiny": {**_GPU, "batch_size": 4, "sft_steps": 4, "long_tokens": 2500, "long_batch": 1, "long_steps": 2, "qlora_steps": 2,
             "dpo_steps": 2, "batch_rows_per_adapter": 2, "batch_max_tokens": 8, "batch_max_rows": 4, "parity_prompts": 2,
             "parity_max_tokens": 8, "validate_mib": 2, "distill_results": 2_000, "ray_caps": (1, 2), "ray_repeats": 1,
             "allreduce_repeats": 2},
}  # fmt: skip


class Skip(Exception):
    """The stage cannot run here; `reason` says why (and what would make it run)."""

    def __init__(self, reason: str, parts: dict | None = None):
        super().__init__(reason)
        self.reason, self.parts = reason, parts or {}


def gb_s(nbytes: int, seconds: float) -> float:
    """GB per second to four significant figures (the smoke moves megabytes, the GPU run gigabytes)."""
    return float(f"{nbytes / 1e9 / seconds:.4g}")


def skipped(reason: str) -> dict:
    """A part of a stage that did not run, with its reason (the stage's other parts still ran)."""
    return {"status": "skipped", "reason": reason}


@dataclass
class Ctx:
    tiny: bool
    work: Path
    repo: Path
    carry: Path
    use_carry: bool
    cuda: bool
    timeout_s: float
    results: dict = field(default_factory=dict)  # earlier stages: {name: {"status", "figures"}}

    @classmethod
    def from_json(cls, raw: dict) -> "Ctx":
        return cls(raw["tiny"], Path(raw["work"]), Path(raw["repo"]), Path(raw["carry"]), raw["use_carry"], raw["cuda"],
                   raw["timeout_s"], raw["results"])  # fmt: skip

    @property
    def size(self) -> dict:
        return PROFILES["tiny" if self.tiny else "gpu"]

    @property
    def store_url(self) -> str:
        return (self.work / "objects").as_uri()

    @property
    def mirror_root(self) -> Path:
        """The `dir:` model source holding the generated base (catalog/model_source.py)."""
        return self.work / "mirror"

    @property
    def model_source(self) -> str:
        return f"dir:{self.mirror_root}"

    @property
    def cache_root(self) -> Path:
        return self.work / "cache"

    def figures(self, stage: str) -> dict:
        return self.results.get(stage, {}).get("figures", {})

    def ready(self, group: str) -> str | None:
        """None when the install stage imported `group`'s packages, else why not."""
        probe = self.figures("install").get("ready", {}).get(group)
        if probe is None or probe is True:
            return None
        return f"{group} is not importable here ({probe})"


def cuda_reason() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA"


_earlier_peaks = [0]  # reserved peaks before each `reset_peak`: the stage's peak is the largest of all


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        import gc

        torch.cuda.synchronize()
        _earlier_peaks.append(torch.cuda.max_memory_reserved())
        gc.collect()  # the last run's model: its cached blocks would count towards the next run's peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def part_peak_gib() -> float | None:
    """The CUDA caching allocator's peak reserved memory since the last `reset_peak` (None on CPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return round(torch.cuda.max_memory_reserved() / 2**30, 2)


def peak_memory() -> dict:
    """This stage process's peak: the GPU's (torch's caching allocator, reserved) where it used one,
    else its host RSS. Ray workers and subprocesses (the vLLM engine) are not included."""
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"device": "cuda", "peak_bytes": max(torch.cuda.max_memory_reserved(), *_earlier_peaks),
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "host_peak_rss_bytes": host}  # fmt: skip
    return {"device": "cpu", "peak_bytes": host, "host_peak_rss_bytes": host}
