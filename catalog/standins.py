"""Tiny stand-in bases, generated deterministically, for `OPENFT_MODEL_SOURCE=standin`.

Tests and the demo have no Hugging Face hub, so every base can resolve to a stand-in: the family's
real transformers architecture class with a few small layers and seeded random weights (bf16
safetensors, like the real shards the merge reads), a byte-level BPE tokenizer trained offline on
catalog/_tokenizer_corpus.py with the family's control tokens as special tokens, and a chat
template that renders like the family's (catalog/_templates.py). Everything after loading
(model_source.py) runs the same code as real weights.

A stand-in directory is built in a temporary sibling and renamed into place, so a directory that
exists is complete; `openft_standin.json` records the base, the revision it stands in for and the
SHA-256 of every file, which the merge checks base files against.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN_SPLIT
from transformers import (
    AutoModelForCausalLM,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3_5TextConfig,
    Qwen3Config,
)

from catalog._templates import TEMPLATES
from catalog._tokenizer_corpus import corpus
from catalog.bases import BaseModelSpec

MANIFEST = "openft_standin.json"
# Bump when the recipe changes so caches built by an older recipe are not reused.
RECIPE_VERSION = 1
VOCAB_SIZE = 3072
SEED = 0
THINK_TOKENS = ("<think>", "</think>")
# Llama 3's pre-tokenizer split (tiktoken cl100k style): digits in groups of up to three.
LLAMA3_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Shared by every family: small enough to build in well under a second, big enough to learn a
# ticket -> label mapping in a few CPU minutes.
_DIMS = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=32768,
)


@dataclass(frozen=True)
class _Recipe:
    bos: str | None  # the family's begin-of-text token, if its tokenizer has one
    pad: str  # the family's pad token (added as `<pad>` where the real tokenizer has none)
    adds_bos: bool  # the real tokenizer prepends bos when encoding with special tokens
    split: str | None  # the family's pre-tokenizer regex; None: GPT-2's byte-level split
    config: Callable[..., PretrainedConfig]


def _llama_config(**kw) -> PretrainedConfig:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return LlamaConfig(rope_parameters=rope, **kw)


def _gpt_oss_config(**kw) -> PretrainedConfig:
    # The real config: YaRN from 4,096 to 131,072 positions, experts as wide as the hidden size.
    kw.update(intermediate_size=128, max_position_embeddings=131072)
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096}
    return GptOssConfig(
        rope_parameters=rope,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        **kw,
    )


def _qwen35_config(**kw) -> PretrainedConfig:
    # The real model interleaves three gated-delta-net layers per full-attention layer; two layers
    # keep one of each so both code paths run.
    return Qwen3_5TextConfig(
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        **kw,
    )


_RECIPES: dict[str, _Recipe] = {
    "qwen2.5": _Recipe(None, "<|endoftext|>", False, QWEN_SPLIT, Qwen2Config),
    "qwen3": _Recipe(None, "<|endoftext|>", False, QWEN_SPLIT, Qwen3Config),
    "qwen3.5": _Recipe(None, "<|endoftext|>", False, QWEN_SPLIT, _qwen35_config),
    "mistral": _Recipe("<s>", "<pad>", True, None, lambda **kw: MistralConfig(sliding_window=None, **kw)),
    "llama3.1": _Recipe("<|begin_of_text|>", "<|finetune_right_pad_id|>", True, LLAMA3_SPLIT, _llama_config),
    "gpt-oss": _Recipe("<|startoftext|>", "<|endoftext|>", False, None, _gpt_oss_config),
}


def special_tokens(base: BaseModelSpec) -> list[str]:
    """The stand-in tokenizer's special tokens, in id order starting at 0."""
    recipe = _RECIPES[base.family]
    tokens = list(base.control_tokens)
    extra = [recipe.bos, recipe.pad, *(THINK_TOKENS if base.thinking_template else ())]
    tokens += [t for t in extra if t and t not in tokens]
    return tokens


def standin_dir(base: BaseModelSpec, cache_root: Path) -> Path:
    """The stand-in's HF-format directory under `cache_root`, generated first if missing."""
    final = cache_root / "standins" / f"{base.id}-{base.revision[:12]}-r{RECIPE_VERSION}"
    if (final / MANIFEST).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build_standin(base, tmp)
        tmp.rename(final)
    except OSError as exc:
        # Another process built the same deterministic stand-in first: keep theirs.
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (final / MANIFEST).is_file():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


def build_standin(base: BaseModelSpec, out: Path) -> None:
    """Write the stand-in's tokenizer, weights and manifest into the empty directory `out`."""
    tokenizer = build_tokenizer(base)
    tokenizer.save_pretrained(out)
    model = build_model(base, tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest = {
        "base": base.id,
        "hf_repo": base.hf_repo,
        "revision": base.revision,
        "recipe_version": RECIPE_VERSION,
        "files": {p.relative_to(out).as_posix(): _sha256(p) for p in files},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def build_tokenizer(base: BaseModelSpec) -> PreTrainedTokenizerFast:
    recipe = _RECIPES[base.family]
    specials = special_tokens(base)
    tok = Tokenizer(models.BPE())
    if recipe.split:
        # Same normalizer and split as the family's transformers tokenizer class, which rebuilds
        # them on load (Qwen2Tokenizer does): training under another split would change encodings.
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(recipe.split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(SEED), trainer)
    byte_level = processors.ByteLevel(trim_offsets=False)
    if recipe.adds_bos:
        bos_id = tok.token_to_id(recipe.bos)
        bos_first = processors.TemplateProcessing(
            single=f"{recipe.bos} $A", pair=f"{recipe.bos} $A {recipe.bos} $B", special_tokens=[(recipe.bos, bos_id)]
        )
        tok.post_processor = processors.Sequence([byte_level, bos_first])
    else:
        tok.post_processor = byte_level
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=recipe.bos,
        eos_token=base.end_of_turn,
        pad_token=recipe.pad,
        chat_template=TEMPLATES[base.family],
        model_max_length=base.max_seq_length,
        clean_up_tokenization_spaces=False,
    )


def build_model(base: BaseModelSpec, tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    recipe = _RECIPES[base.family]
    config = recipe.config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        tie_word_embeddings=base.tied_lm_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **_DIMS,
    )
    config.architectures = [base.architecture]
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if type(model).__name__ != base.architecture:
        raise RuntimeError(f"stand-in for {base.id} built {type(model).__name__}, expected {base.architecture}")
    return model.to(torch.bfloat16)


def read_manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST).read_text())


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
