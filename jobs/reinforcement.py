"""Reinforcement fine-tuning at create (issue 26 item 1): OpenAI's `method.reinforcement` (a grader
and its hyperparameters) as the job spec's fields, every `auto` resolved.

Where it sits: jobs/params.py `parse_create_request` calls `parse_grader` and `hyperparameters` for a
job whose `method.type` is `reinforcement`; jobs/files.py checks the rows against the grader's
`{{item.*}}` references (`item_references`) while it checks them against the base's template; the
recipe (train/rft.py) reads the spec's fields through `TrainJob`.

Decisions (OpenAI's reference names the hyperparameters without fixing their meaning here):
- `batch_size`: prompts per step; auto 8.
- `compute_multiplier` scales the completions sampled per prompt (the group): k = round(8 x
  multiplier); auto and 1.0 mean 8 samples per prompt; 0.25 to 4, so 2 to 32 samples (a group of one
  has no relative advantage).
- `eval_interval`: training steps between validation evaluations (each saves a checkpoint carrying
  its reward); auto 10. The validation reward is also measured before the first step and after the last.
- `eval_samples`: completions sampled per validation prompt, their rewards averaged; auto 1.
- `n_epochs`: passes over the training prompts; auto 1. `learning_rate_multiplier` times 2e-5; auto 1.0.
- `reasoning_effort`: `default` everywhere; on a base whose template has a thinking switch (qwen3,
  `thinking_template`) `low` turns thinking off and `medium` / `high` turn it on; on any other base a
  value other than `default` is refused by name (there is nothing for it to change).
- Our own keys, numbers only: `beta`, the KL coefficient (0.04, GRPO's), `max_completion_tokens`
  (256: the longest sampled completion), `temperature` (1.0, 0.01 to 2: of every sampled completion,
  training and validation; the tiny stand-in bases need a low one, their frozen head keeps every
  logit within about +-1.5, so at 1.0 they sample near-uniform noise), and `learning_rate`, `lora_rank`, `lora_alpha`,
  `max_seq_length` as for the other methods.
- The grader is `graders/`' (`validate`, its refusals and params under `method.reinforcement.grader`),
  stored in its JSON form (`graders.validate.record`). `label_model` is accepted only inside `multi`,
  as OpenAI's reinforcement method types it; multi graders do not nest (graders/ refuses that).
"""

from __future__ import annotations

from typing import Any, Callable

from catalog.bases import BaseModelSpec
from graders.models import MultiGrader
from graders.templates import Reference
from graders.validate import Rules, item_references, record, validate
from jobs._values import float_in, int_in, invalid

OPENAI_KEYS = ("batch_size", "compute_multiplier", "eval_interval", "eval_samples", "learning_rate_multiplier",
               "n_epochs", "reasoning_effort")
OWN_KEYS = ("learning_rate", "lora_rank", "lora_alpha", "max_seq_length", "beta", "max_completion_tokens", "temperature")
AUTO_KEYS = frozenset({"batch_size", "compute_multiplier", "eval_interval", "eval_samples",
                       "learning_rate_multiplier", "n_epochs"})
SAMPLES_AT_ONE = 8  # completions per prompt at compute_multiplier 1.0 (and auto)
MIN_MULTIPLIER, MAX_MULTIPLIER = 0.25, 4.0
BATCH_SIZE, EVAL_INTERVAL, EVAL_SAMPLES = 8, 10, 1
BASE_LEARNING_RATE, MIN_LEARNING_RATE = 2e-5, 1e-7
KL_BETA = 0.04  # GRPO's (Shao et al. 2024, arXiv:2402.03300, section 4.2)
MAX_COMPLETION_TOKENS, COMPLETION_TOKENS_LIMIT = 256, 4096
REASONING_EFFORTS = ("default", "low", "medium", "high")


def samples_per_prompt(compute_multiplier: float) -> int:
    return max(2, round(SAMPLES_AT_ONE * compute_multiplier))


def parse_grader(raw: Any, param: str, rules: Rules | None) -> dict:
    """The grader's JSON form, or the refusal (param under `param`)."""
    if raw is None:
        raise invalid(f"{param} is required: the grader that scores each sampled completion.", param,
                      "missing_required_parameter")
    if isinstance(raw, dict) and raw.get("type") == "label_model":
        raise invalid(f"{param}.type label_model is accepted only inside a multi grader for reinforcement "
                      "fine-tuning, as OpenAI's reinforcement method has it; use score_model, or wrap it in multi.",
                      f"{param}.type", "unsupported_value")
    return record(validate(raw, param, rules))


def hyperparameters(given: Callable[[str], Any], path: str, base: BaseModelSpec) -> dict[str, Any]:
    """The reinforcement-only fields of the spec; `given(key)` is the caller's value, None for auto or absent."""

    def value(key: str, default, check):
        raw = given(key)
        return default if raw is None else check(raw, f"{path}.{key}")

    multiplier = value("compute_multiplier", 1.0, lambda v, p: float_in(v, p, MIN_MULTIPLIER, MAX_MULTIPLIER))
    effort = given("reasoning_effort") or "default"
    if effort not in REASONING_EFFORTS:
        raise invalid(f"{path}.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}.",
                      f"{path}.reasoning_effort")
    if effort != "default" and not base.thinking_template:
        raise invalid(f"reasoning_effort {effort} needs a base with a thinking mode, and {base.id} has none; leave "
                      "reasoning_effort out (or default), or train qwen3-8b.", f"{path}.reasoning_effort")
    return {
        "compute_multiplier": multiplier,
        "samples_per_prompt": samples_per_prompt(multiplier),
        "eval_interval": value("eval_interval", EVAL_INTERVAL, lambda v, p: int_in(v, p, 1, 10_000)),
        "eval_samples": value("eval_samples", EVAL_SAMPLES, lambda v, p: int_in(v, p, 1, 32)),
        "reasoning_effort": effort,
        "max_completion_tokens": value("max_completion_tokens", MAX_COMPLETION_TOKENS,
                                       lambda v, p: int_in(v, p, 1, COMPLETION_TOKENS_LIMIT)),
        "temperature": value("temperature", 1.0, lambda v, p: float_in(v, p, 0.01, 2.0)),
    }


def enable_thinking(reasoning_effort: str | None, base: BaseModelSpec) -> bool | None:
    """The template's thinking switch for a reasoning effort; None: the base has none (or default)."""
    if not base.thinking_template or reasoning_effort in (None, "default"):
        return None
    return reasoning_effort != "low"


def references(grader: dict) -> tuple[tuple[Reference, str], ...]:
    """The grader's `{{item.*}}` references and where each is (`method.reinforcement.grader...`)."""
    return tuple(item_references(validate(grader, "grader"), "method.reinforcement.grader"))


def grader_model_names(grader: dict) -> list[str]:
    parsed = validate(grader, "grader")
    graders = parsed.graders.values() if isinstance(parsed, MultiGrader) else [parsed]
    return [g.model for g in graders if g.type in ("score_model", "label_model")]


def uses_model_graders(grader: dict) -> bool:
    return bool(grader_model_names(grader))
