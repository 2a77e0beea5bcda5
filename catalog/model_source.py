"""Where a base's weights and tokenizer come from, and loading them.

`Settings.model_source` picks one of three sources, parsed once at an entry point and passed down:

- `hub`: the Hugging Face hub at the base's pinned revision, cached under `cache_root/hub`.
- `dir:/path`: a local mirror with one directory per base at `/path/<hf_repo>` (for example
  `/mirror/Qwen/Qwen2.5-0.5B-Instruct`) holding a `.openft_revision` file with the pinned commit,
  or an HF cache layout (`/path/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/<commit>/`, what
  `HF_HOME/hub` holds after a download), whose snapshot directory is named by the commit.
  A mirror at any other revision is refused: jobs train on the pinned commit and nothing else.
- `standin`: tiny generated bases (catalog/standins.py) for tests and the demo.

Everything after `resolve_base_dir` is the same code for all three.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from catalog.bases import BaseModelSpec

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from transformers import PreTrainedTokenizerFast

# torch and transformers (and catalog.standins, which builds bases with them) are imported where a
# base is loaded, not here: the API, the job controller and the CLI import this module to parse and
# resolve sources, and importing torch and transformers cost each of those processes about 4 CPU-s
# at start (`python -X importtime -c "import serve_app.deployment"`). One thread at a time imports
# them and loads: transformers' lazy module (which also imports a model's or tokenizer's classes in
# `from_pretrained`) is not safe on first use from several threads (the API's request threads got
# "cannot import name 'AutoTokenizer'" when eight job creates loaded the first tokenizer at once).
_IMPORTING = threading.Lock()

REVISION_MARKER = ".openft_revision"


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["hub", "dir", "standin"]
    root: Path | None = None  # the mirror directory for kind "dir"


def parse_model_source(value: str) -> ModelSource:
    """Parse `hub`, `dir:/path` or `standin` (the `OPENFT_MODEL_SOURCE` setting)."""
    if value in ("hub", "standin"):
        return ModelSource(value)
    if value.startswith("dir:") and len(value) > len("dir:"):
        return ModelSource("dir", Path(value[len("dir:") :]))
    raise ValueError(f"model_source {value!r} is not one of: hub, dir:/path/to/mirror, standin.")


def resolve_base_dir(base: BaseModelSpec, source: ModelSource, cache_root: Path) -> Path:
    """The local HF-format directory holding `base` at its pinned revision."""
    if source.kind == "standin":
        with _IMPORTING:  # building a stand-in also reaches transformers' lazy classes (from_config)
            from catalog.standins import standin_dir

            return standin_dir(base, cache_root)
    if source.kind == "hub":
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(base.hf_repo, revision=base.revision, cache_dir=cache_root / "hub"))
    return _mirror_dir(base, source.root)


def _mirror_dir(base: BaseModelSpec, root: Path) -> Path:
    plain = root / base.hf_repo
    if plain.is_dir():
        marker = plain / REVISION_MARKER
        if not marker.is_file():
            raise FileNotFoundError(
                f"The mirror {plain} has no {REVISION_MARKER} file; write the revision it holds "
                f"({base.revision} is pinned for {base.id}) into it."
            )
        found = marker.read_text().strip()
        if found != base.revision:
            raise ValueError(
                f"The mirror {plain} holds revision {found}, but {base.id} is pinned to {base.revision}; "
                "download the pinned revision into the mirror."
            )
        return plain
    snapshot = root / f"models--{base.hf_repo.replace('/', '--')}" / "snapshots" / base.revision
    if snapshot.is_dir():
        return snapshot
    raise FileNotFoundError(
        f"The mirror {root} has neither {plain} nor {snapshot}; download {base.hf_repo} at revision "
        f"{base.revision} into one of them."
    )


_NO_COMPILE = "TORCHDYNAMO_DISABLE"  # read by torch.compile at each call (torch._dynamo.optimize)


def import_peft() -> ModuleType:
    """peft, for the code that applies or trains an adapter: the first import in a process goes
    through here (under the import lock), so that the bitsandbytes it imports eagerly (peft.helpers)
    imports without compiling. bitsandbytes wraps its CPU kernels in `torch.compile` at import,
    which imports torch's compiler stack: 1.4 CPU-s of every process that imports peft (a Train
    worker, a generation actor; 6.60 against 8.03, bench/process_start.py). Those kernels then run
    eagerly: nothing here compiles them, and on a GPU bitsandbytes runs its CUDA kernels instead."""
    with _IMPORTING:
        if "peft" not in sys.modules:
            before = os.environ.get(_NO_COMPILE)
            os.environ[_NO_COMPILE] = "1"
            try:
                import peft  # noqa: F401
            finally:
                if before is None:
                    del os.environ[_NO_COMPILE]
                else:
                    os.environ[_NO_COMPILE] = before
    return sys.modules["peft"]


def load_tokenizer(base: BaseModelSpec, source: ModelSource, cache_root: Path) -> PreTrainedTokenizerFast:
    directory = resolve_base_dir(base, source, cache_root)
    with _IMPORTING:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(directory)


def load_model(
    base: BaseModelSpec,
    source: ModelSource,
    cache_root: Path,
    *,
    dtype: torch.dtype | None = None,
    quantization: Literal[None, "nf4"] = None,
) -> torch.nn.Module:
    """The base as `AutoModelForCausalLM` in `dtype` (float32 when None); `quantization="nf4"` loads
    4-bit NF4 weights for QLoRA."""
    if quantization not in (None, "nf4"):
        raise ValueError(f"quantization {quantization!r} is not one of: None, 'nf4'.")
    directory = resolve_base_dir(base, source, cache_root)
    with _IMPORTING:
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        dtype = torch.float32 if dtype is None else dtype
        kwargs = {}
        if quantization == "nf4":
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            )
        return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
