"""Reading and validating a LoRA adapter (adapter_config.json and its safetensors header) for a merge.

First step of the flow (`merge/run.py`): the adapter names its own base (peft's
`base_model_name_or_path` and `revision`, written by training), and everything the merge needs
from it is checked here, before a single base byte is read: a LoRA config whose merge is exactly
`W + B·A × lora_alpha / r` (no DoRA, rsLoRA, fan_in_fan_out, per-module patterns, biases or fully
trained modules), rank and alpha in range, and tensors that pair up as `lora_A` (r, in) and
`lora_B` (out, r) of a module the config targets. The result is a `LoraAdapter`; its base-side
shapes are checked against the base's headers in `merge/plan.py`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from catalog.bases import BASES, BaseModelSpec
from merge._header import Entry, Header, HeaderError, read_header
from merge.errors import MergeError

FACTOR_DTYPES = ("F32", "BF16", "F16")
MAX_ALPHA = 256
_NAME = re.compile(r"base_model\.model\.(?P<module>[A-Za-z0-9_.]+)\.lora_(?P<ab>[AB])\.weight")
# peft options under which the merged weight is something other than W + B·A × alpha / r (or under
# which the adapter carries more than LoRA factors); each must be absent or empty.
_UNSUPPORTED = (
    "use_dora", "use_rslora", "fan_in_fan_out", "rank_pattern", "alpha_pattern", "lora_bias",
    "modules_to_save", "target_parameters", "trainable_token_indices", "layer_replication",
    "megatron_config", "alora_invocation_tokens", "use_qalora", "use_bdlora", "arrow_config",
    "kasa_config", "monteclora_config", "velora_config",
)  # fmt: skip


@dataclass(frozen=True)
class Factor:
    """One adapted module: its base weight gets `B @ A × scale` added."""

    module: str  # e.g. model.layers.0.self_attn.q_proj
    a: Entry  # (r, in)
    b: Entry  # (out, r)

    @property
    def base_tensor(self) -> str:
        return f"{self.module}.weight"


@dataclass(frozen=True)
class LoraAdapter:
    base: BaseModelSpec
    r: int
    alpha: float
    factors: tuple[Factor, ...]
    header: Header

    @property
    def scale(self) -> float:
        return self.alpha / self.r  # what peft's LoraLayer.update_layer stores as `scaling`


def adapter_base(name: object) -> BaseModelSpec | None:
    """The catalog base an adapter's `base_model_name_or_path` names: the base id, its Hugging Face
    repo, or a directory the training loaded it from (a mirror `<root>/<org>/<name>`, an HF cache
    snapshot, or a stand-in directory)."""
    if not isinstance(name, str) or not name.strip("/"):
        return None
    path = PurePosixPath(name.rstrip("/"))
    for base in BASES.values():
        cache = f"models--{base.hf_repo.replace('/', '--')}"
        if (
            name in (base.id, base.hf_repo)
            or str(path).endswith("/" + base.hf_repo)
            or cache in path.parts
            or path.name.startswith(f"{base.id}-{base.revision[:12]}-r")
        ):
            return base
    return None


def recorded_revision(config: dict) -> str | None:
    """The base revision the adapter was trained on: peft's `revision`, else an HF snapshot path's."""
    revision = config.get("revision")
    if isinstance(revision, str) and revision:
        return revision
    parts = PurePosixPath(str(config.get("base_model_name_or_path") or "")).parts
    if len(parts) >= 2 and parts[-2] == "snapshots":
        return parts[-1]
    return None


def parse_config(config_bytes: bytes, base: BaseModelSpec) -> dict:
    """adapter_config.json as a dict; refuses one made for another base or revision."""
    try:
        config = json.loads(config_bytes)
    except (UnicodeDecodeError, ValueError):
        raise MergeError("merge_adapter_config", "adapter_config.json is not JSON.") from None
    if not isinstance(config, dict):
        raise MergeError("merge_adapter_config", "adapter_config.json is not a JSON object.")
    named = adapter_base(config.get("base_model_name_or_path"))
    if named is None:
        raise MergeError(
            "merge_base_unknown",
            "adapter_config.json's base_model_name_or_path is not one of the fine-tuning base models.",
        )
    if named.id != base.id:
        raise MergeError(
            "merge_adapter_config", f"The adapter was trained on {named.id}, not on {base.id}; merge it into {named.id}."
        )
    revision = recorded_revision(config)
    if revision != base.revision:
        found = "records no revision" if revision is None else "records another revision"
        raise MergeError(
            "merge_base_revision",
            f"adapter_config.json {found} of {base.id}; only adapters trained on the pinned revision "
            f"{base.revision} can be merged.",
        )
    return config


def validate_adapter(config_bytes: bytes, read: Callable[[int, int], bytes], size: int, base: BaseModelSpec) -> LoraAdapter:
    """Check adapter_config.json and the safetensors header of the `size`-byte adapter file that
    `read(start, end)` reads (only the header is read); raise MergeError with the first problem."""
    config = parse_config(config_bytes, base)
    try:
        header = read_header(read, size)
    except HeaderError as exc:
        raise MergeError("merge_adapter_header", f"adapter_model.safetensors: {exc}.") from None
    _check_tied_lm_head(config, header, base)
    _check_options(config)
    r = _rank(config, base)
    alpha = _alpha(config, r)
    return LoraAdapter(base=base, r=r, alpha=alpha, factors=_factors(header, config, r), header=header)


def _targets_lm_head(config: dict, header: Header) -> bool:
    named = [config.get("modules_to_save") or [], config.get("target_modules") or []]
    names = [n for group in named if isinstance(group, list) for n in group if isinstance(n, str)]
    modules = [m.group("module") for e in header.entries if (m := _NAME.fullmatch(e.name))]
    return any(n.split(".")[-1] in ("lm_head", "embed_tokens") for n in names) or any(
        m.split(".")[-1] == "lm_head" for m in modules
    )


def _check_tied_lm_head(config: dict, header: Header, base: BaseModelSpec) -> None:
    if base.tied_lm_head and _targets_lm_head(config, header):
        raise MergeError(
            "merge_tied_lm_head",
            f"The adapter trains lm_head, which {base.id} shares with its embeddings, so it cannot be merged; "
            "train without lm_head in target_modules or modules_to_save.",
        )


def _check_options(config: dict) -> None:
    if config.get("peft_type") != "LORA":
        raise MergeError("merge_adapter_config", "adapter_config.json's peft_type is not LORA.")
    if config.get("bias", "none") != "none":
        raise MergeError("merge_adapter_config", "adapter_config.json sets bias; only bias \"none\" can be merged.")
    for key in _UNSUPPORTED:
        if config.get(key) not in (None, False, {}, []):
            raise MergeError(
                "merge_adapter_config",
                f"adapter_config.json sets {key}, which the merge does not support (it merges W + B·A × lora_alpha / r only).",
            )


def _rank(config: dict, base: BaseModelSpec) -> int:
    r = config.get("r")
    if type(r) is not int or not 1 <= r <= base.max_rank:
        raise MergeError("merge_rank", f"adapter_config.json's r must be an integer from 1 to {base.max_rank} for {base.id}.")
    return r


def _alpha(config: dict, r: int) -> float:
    alpha = config.get("lora_alpha")
    if type(alpha) not in (int, float):
        raise MergeError("merge_alpha", f"adapter_config.json's lora_alpha must be a number from 1 to {MAX_ALPHA}.")
    if not math.isfinite(alpha / r):
        raise MergeError("merge_scale", "lora_alpha / r is not a finite number; set lora_alpha to a number from 1 to 256.")
    if not 1 <= alpha <= MAX_ALPHA:
        raise MergeError("merge_alpha", f"adapter_config.json's lora_alpha must be a number from 1 to {MAX_ALPHA}.")
    return alpha


def _targeted(module: str, targets: object) -> bool:
    """peft's own rule (`check_target_module_exists`): a list matches a name or a dotted suffix,
    a string is a full-match regex; no target_modules means the architecture's defaults."""
    if targets is None:
        return True
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return isinstance(targets, list) and any(module == t or module.endswith("." + str(t)) for t in targets)


def _factors(header: Header, config: dict, r: int) -> tuple[Factor, ...]:
    if not header.entries:
        raise MergeError("merge_adapter_header", "adapter_model.safetensors holds no tensors.")
    pairs: dict[str, dict[str, Entry]] = {}
    for entry in header.entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or not _targeted(match.group("module"), config.get("target_modules")):
            raise MergeError(
                "merge_adapter_tensor_name",
                f"adapter tensor {entry.name[:200]} is not the lora_A or lora_B weight of a module in target_modules.",
            )
        if entry.dtype not in FACTOR_DTYPES:
            raise MergeError("merge_adapter_dtype", f"adapter tensor {entry.name} is {entry.dtype}, not F32, BF16 or F16.")
        pairs.setdefault(match.group("module"), {})[match.group("ab")] = entry
    factors = []
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise MergeError("merge_adapter_pair", f"adapted module {module} has no {missing} weight.")
        a, b = pair["A"], pair["B"]
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != r or b.shape[1] != r:
            raise MergeError(
                "merge_adapter_shape",
                f"module {module}: lora_A is {list(a.shape)} and lora_B {list(b.shape)}; with r={r} they must be [{r}, in] and [out, {r}].",
            )
        factors.append(Factor(module, a, b))
    return tuple(factors)
