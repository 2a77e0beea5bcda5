"""The eight fine-tuning bases of the reference, as data.

Every rule that differs by base (ranks, adapters, context, control tokens, template rules,
time-limit fit, servability, token-estimate constants) is a field here, so that code paths
never branch on a model id.

Token-estimate constants (used by upload validation and the quote):
- `bytes_per_token` is chosen at or below the real bytes-per-token of the family's tokenizer on
  ordinary English prose and code (Qwen2.5/Qwen3 ~4.3, Llama 3.1 ~4.6, gpt-oss ~4.7, Mistral v0.3
  ~3.7 measured on the public tokenizers), so `content_bytes / bytes_per_token` stays at or above
  the real count. The reference states "about 1.3 times the real count" on English: 4.3 / 3.3 = 1.3.
- `message_overhead_tokens` covers the template's per-message markup (role header, end-of-turn),
  `row_overhead_tokens` what the template adds once per row (Qwen2.5's default system prompt,
  Llama 3.1's date lines, Mistral's BOS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from openft.errors import InvalidRequest

QWEN_CONTROL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
LLAMA_CONTROL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)
MISTRAL_CONTROL = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
HARMONY_CONTROL = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|startoftext|>",
    "<|endoftext|>",
)


@dataclass(frozen=True)
class BaseModelSpec:
    id: str
    family: str  # selects the chat template and stand-in recipe: qwen2.5 | qwen3 | qwen3.5 | mistral | llama3.1 | gpt-oss
    hf_repo: str
    revision: str
    licence: str
    architecture: str  # transformers class of the real model (and of its stand-in)
    max_rank: int  # lora and qlora
    max_rank_dpo: int
    default_adapter: str
    adapters: tuple[str, ...]
    fit_tokens: dict[str, int]  # training tokens (x epochs) that fit the 2-hour limit, per adapter
    control_tokens: tuple[str, ...]
    end_of_turn: str  # what the template writes after an assistant turn; trained so the model stops
    servable: bool
    not_servable_reason: str | None = None
    max_seq_length: int = 2048
    long_context_max_rank: int | None = None  # rank cap above 2,048 tokens where long context is offered
    tools_supported: bool = True
    alternation_required: bool = False
    thinking_template: bool = False  # Qwen3 forms: assistant `</think>` only in the template's own form
    # What closes an assistant turn other than the row's last, where the template writes something
    # else there than end_of_turn (gpt-oss: `<|end|>`; only the final turn ends with `<|return|>`).
    earlier_end_of_turn: str | None = None
    tied_lm_head: bool = False
    gpu_memory_class_gb: int = 48
    bytes_per_token: float = 3.3
    message_overhead_tokens: int = 6
    row_overhead_tokens: int = 4
    created: int = 1730419200  # catalog entry date (2024-11-01) as the models API `created`
    extra_files: tuple[str, ...] = field(default=())  # licence files an export carries besides LICENSE
    # SHA-256 of every file at `revision` (relative path -> hex), which a merge checks the base's bytes
    # against. Empty: not pinned in the catalog yet; the merge then reads the operator-pinned file
    # (merge/plan.py) or refuses with merge_base_digest.
    file_sha256: dict[str, str] = field(default_factory=dict)

    def max_rank_for(self, method: str) -> int:
        return self.max_rank_dpo if method == "dpo" else self.max_rank

    @property
    def long_context(self) -> bool:
        return self.max_seq_length > 2048

    def estimate_tokens(self, content_bytes: int, messages: int, rows: int) -> int:
        """Conservative token estimate for text with these totals (at or above the real count)."""
        return int(
            -(-content_bytes // self.bytes_per_token)
            + messages * self.message_overhead_tokens
            + rows * self.row_overhead_tokens
        )


_SMALL_FIT = {"qwen2.5-0.5b-instruct": 16_500_000, "qwen2.5-1.5b-instruct": 5_940_000}


def _qwen25(size: str, repo: str, revision: str, max_rank_dpo: int, **kw) -> BaseModelSpec:
    small = size in ("0.5b", "1.5b")
    bid = f"qwen2.5-{size}-instruct"
    fit_tokens = kw.pop("fit_tokens", None) or {"lora": _SMALL_FIT[bid], "qlora": _SMALL_FIT[bid]}
    return BaseModelSpec(
        id=bid,
        family="qwen2.5",
        hf_repo=repo,
        revision=revision,
        licence="Apache-2.0",
        architecture="Qwen2ForCausalLM",
        max_rank=64,
        max_rank_dpo=max_rank_dpo,
        default_adapter="qlora" if small else "lora",
        adapters=("lora", "qlora"),
        control_tokens=QWEN_CONTROL,
        end_of_turn="<|im_end|>",
        servable=True,
        tied_lm_head=small,
        gpu_memory_class_gb=24 if small else 48,
        # Qwen2.5 adds "You are Qwen, created by Alibaba Cloud..." when a row has no system message.
        row_overhead_tokens=24,
        bytes_per_token=3.3,
        fit_tokens=fit_tokens,
        **kw,
    )


BASES: dict[str, BaseModelSpec] = {
    b.id: b
    for b in (
        _qwen25("0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "7ae557604adf67be50417f59c2c2f167def9a775", 64),
        _qwen25("1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306", 57),
        _qwen25(
            "7b",
            "Qwen/Qwen2.5-7B-Instruct",
            "a09a35458c702b33eeacc393d103063234e8bc28",
            26,
            fit_tokens={"lora": 5_280_000, "qlora": 1_980_000},
            max_seq_length=8192,
            long_context_max_rank=16,
        ),
        BaseModelSpec(
            id="mistral-7b-instruct-v0.3",
            family="mistral",
            hf_repo="mistralai/Mistral-7B-Instruct-v0.3",
            revision="c170c708c41dac9275d15a8fff4eca08d52bab71",
            licence="Apache-2.0",
            architecture="MistralForCausalLM",
            max_rank=64,
            max_rank_dpo=25,
            default_adapter="lora",
            adapters=("lora", "qlora"),
            fit_tokens={"lora": 4_950_000, "qlora": 1_848_000},
            control_tokens=MISTRAL_CONTROL,
            end_of_turn="</s>",
            servable=True,
            alternation_required=True,
            # 32k-vocabulary SentencePiece: shorter tokens than the 150k BPE vocabularies.
            bytes_per_token=2.8,
            message_overhead_tokens=5,
            row_overhead_tokens=2,
        ),
        BaseModelSpec(
            id="qwen3-8b",
            family="qwen3",
            hf_repo="Qwen/Qwen3-8B",
            revision="b968826d9c46dd6066d109eabc6255188de91218",
            licence="Apache-2.0",
            architecture="Qwen3ForCausalLM",
            max_rank=64,
            max_rank_dpo=24,
            default_adapter="lora",
            adapters=("lora", "qlora"),
            fit_tokens={"lora": 4_620_000, "qlora": 1_650_000},
            control_tokens=QWEN_CONTROL,
            end_of_turn="<|im_end|>",
            servable=True,
            max_seq_length=8192,
            long_context_max_rank=16,
            tools_supported=False,
            thinking_template=True,
            # Non-thinking form adds an empty <think></think> block to the last assistant turn.
            message_overhead_tokens=10,
        ),
        BaseModelSpec(
            id="llama-3.1-8b-instruct",
            family="llama3.1",
            hf_repo="RedHatAI/Llama-3.1-8B-Instruct",
            revision="83c927477af31b2c66de4c0210ae5fa04b28289b",
            licence="Llama 3.1 Community License",
            architecture="LlamaForCausalLM",
            max_rank=64,
            max_rank_dpo=25,
            default_adapter="lora",
            adapters=("lora", "qlora"),
            fit_tokens={"lora": 4_752_000, "qlora": 1_782_000},
            control_tokens=LLAMA_CONTROL,
            end_of_turn="<|eot_id|>",
            servable=True,
            max_seq_length=8192,
            long_context_max_rank=16,
            tools_supported=False,
            bytes_per_token=3.5,
            # The leading system turn with "Cutting Knowledge Date" and "Today Date" lines.
            row_overhead_tokens=30,
            extra_files=("USE_POLICY.md",),
        ),
        BaseModelSpec(
            id="gpt-oss-20b",
            family="gpt-oss",
            hf_repo="openai/gpt-oss-20b",
            revision="6cee5e81ee83917806bbde320786a8fb61efebee",
            licence="Apache-2.0",
            architecture="GptOssForCausalLM",
            max_rank=64,
            max_rank_dpo=64,
            default_adapter="lora",
            adapters=("lora",),
            fit_tokens={"lora": 858_000},
            control_tokens=HARMONY_CONTROL,
            end_of_turn="<|return|>",
            earlier_end_of_turn="<|end|>",
            servable=False,
            not_servable_reason="Batches on gpt-oss-20b fine-tunes are not offered yet: download the adapter.",
            bytes_per_token=3.5,
            # The harmony system message (model identity, dates, reasoning level) opens every row.
            row_overhead_tokens=40,
            message_overhead_tokens=8,
        ),
        BaseModelSpec(
            id="qwen3.5-9b",
            family="qwen3.5",
            hf_repo="Qwen/Qwen3.5-9B",
            revision="c202236235762e1c871ad0ccb60c8ee5ba337b9a",
            licence="Apache-2.0",
            architecture="Qwen3_5ForCausalLM",
            max_rank=36,
            max_rank_dpo=36,
            default_adapter="lora",
            adapters=("lora",),
            fit_tokens={"lora": 2_640_000},
            control_tokens=QWEN_CONTROL,
            end_of_turn="<|im_end|>",
            servable=False,
            not_servable_reason="Batches on qwen3.5-9b fine-tunes are not offered yet: download the adapter.",
            tools_supported=False,
            thinking_template=True,
            message_overhead_tokens=10,
        ),
    )
}


def get_base(model_id: str, param: str = "model") -> BaseModelSpec:
    try:
        return BASES[model_id]
    except KeyError:
        raise InvalidRequest(
            f"model is not a fine-tuning base. Use one of: {', '.join(BASES)}.",
            code="model_not_available",
            param=param,
        ) from None


def served_bases(online_bases: list[str] | None) -> list[str]:
    """The bases answered online (the setting `online_bases`; None for every servable base), in
    catalog order."""
    return [b.id for b in BASES.values() if b.servable and (online_bases is None or b.id in online_bases)]


def not_servable(online_bases: list[str] | None) -> list[str]:
    """The names in `online_bases` that are not a servable base of the catalog: `openft serve`
    refuses to start with one (entrypoints/preflight.py), as it would never answer."""
    return [name for name in online_bases or () if name not in BASES or not BASES[name].servable]


def unpriced(rates: Mapping[str, object]) -> list[str]:
    """The bases a price table's `rates` has no rate for: a base without a price would only fail at its
    first create, so `openft serve` refuses to start with one (entrypoints/preflight.py)."""
    return [base_id for base_id in BASES if base_id not in rates]
