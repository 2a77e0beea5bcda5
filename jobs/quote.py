"""The job's quote (`gridline.quote`) and the 2-hour admission rule (`job_too_large`).

Where it sits: jobs/files.py `check_files` calls `quote_job` after jobs/params.py
`check_job_files`; the quote is stored on the job and returned in the create response. Pure: the
price table comes in as an argument (from `Settings`).

Timing model (conservative, as the reference's "Limits" asks):
- A base trains `fit_tokens[adapter] / 7200` tokens per second: the catalog's fit is what the
  2-hour limit holds at that speed. DPO counts every token twice (reference pass, two answers).
- Around training: `STARTUP_SECONDS` to load the base and tokenize, and evaluation before and
  after training, forward passes only, at `EVAL_SPEEDUP` times the training speed. This is why
  "a bit less fits once evaluation is counted": the refusal gives the exact count that fits.
- Training tokens are the file's per-base estimate x epochs, over the whole training file (the
  holdout rows are not subtracted: the estimate stays an upper side). A file uploaded before
  per-base estimates existed has none and counts its byte-based upper bound instead.

Reinforcement (issue 26): a step samples `samples_per_prompt` completions per prompt and trains on
each (prompt + completion) sequence, so the training tokens per epoch are samples x (the prompts'
estimate + rows x `max_completion_tokens`), an upper side (completions stop at their end-of-turn).
Time adds generating every completion at a `GENERATION_SLOWDOWN`-th of the training speed (one token
per forward, where training takes a whole sequence per pass), the reference (KL) forward at a third
of a step, and the validation reward: validation prompts x `eval_samples` completions generated at
each evaluation (before, every `eval_interval` steps, after). Model graders read each completion with
their prompt: `GRADER_PROMPT_TOKENS` + the completion in, `DEFAULT_MAX_TOKENS` out, per grader,
generated too. The trained tokens are charged at the DPO rate (twice supervised on the default
table): each is generated as well as trained.

Money: USD as floats holding whole cents, computed in `Decimal` from the rates' decimal text.
`estimated_usd` rounds half up and may be below the minimum (the reference says so);
`max_charge_usd` rounds up, counted at the token upper bound x epochs at the method's rate, and is
at least `minimum_usd`. DPO is charged on its training tokens once (the prompt and both answers,
every epoch) at the DPO rate: the 2x slowdown is priced in that rate, not in the token count.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Literal

from pydantic import BaseModel

from catalog.bases import BaseModelSpec, get_base
from jobs.params import FileFacts, eval_rows_for
from jobs.spec import JobSpec
from openft.errors import InvalidRequest
from openft.pricing import PriceTable

# The catalog's `fit_tokens` are the tokens a base trains in this many seconds: a speed, not the limit.
FIT_SECONDS = 7200
TIME_LIMIT_SECONDS = 7200  # the reference's v1 limit; the service's own is `job_time_limit_seconds`
STARTUP_SECONDS = 120
EVAL_SPEEDUP = 3  # a forward pass costs about a third of forward + backward
EVAL_PASSES = 2  # eval loss before and after training
DPO_SLOWDOWN = 2
GENERATION_SLOWDOWN = 4  # a generated token costs about four trained ones (one token per forward, batched)
GRADER_PROMPT_TOKENS = 512  # a model grader's own prompt around the completion
LARGE_GPU_GB = 48  # DPO and long-context jobs always train on a 48 GB GPU
CENT = Decimal("0.01")


class PerToken(BaseModel):
    trained_usd_per_mtok: float
    """USD per million trained tokens (tokens x epochs) for this base and method."""
    minimum_usd: float
    """The least a succeeded job is charged."""
    max_charge_usd: float
    """The most this job can be charged: the token upper bound x epochs at the rate, at least the minimum."""


class Quote(BaseModel):
    training_tokens_upper_bound: int
    """Tokens x epochs, an upper bound from the training file's bytes."""
    training_tokens_per_epoch_upper_bound: int
    """The same bound for one epoch."""
    n_epochs: int
    eval_rows: int
    """Validation file rows, or the 5 % holdout of training rows."""
    estimated_seconds: int
    """Startup, evaluation and training time, counting tokens with the base's estimate."""
    estimated_usd: float
    """Cost of the estimated tokens at the rate; not what is charged (see `per_token`)."""
    basis: str
    """The estimate's assumptions, in words."""
    reinforcement: dict | None = None
    """Reinforcement jobs: `{samples_per_prompt, generated_tokens, grader_tokens, evaluations}`, the
    tokens generated per job (completions, and model graders' prompts and answers) and the validation
    evaluations counted in `estimated_seconds`."""
    per_token: PerToken
    estimate: Literal[True] = True
    gpu_memory_class_gb: int

    def record(self) -> dict:
        """What the job stores and shows as `gridline.quote` (`reinforcement` only on reinforcement jobs)."""
        return self.model_dump(exclude_none=True)

    def estimated_finish(self, created_at: int) -> int:
        """OpenAI's `estimated_finish`: the creation time plus the estimate."""
        return created_at + self.estimated_seconds


@dataclass(frozen=True)
class Workload:
    """A job's estimated tokens and seconds, and how many training tokens its limit holds."""

    tokens_per_epoch: int
    training_tokens: int  # x epochs
    eval_rows: int
    eval_tokens: int
    eval_seconds: int  # both passes
    train_seconds: int
    seconds: int  # startup + evaluation + training
    fit_tokens: int  # training tokens (x epochs) that fit in the limit beside startup and evaluation
    tokens_per_second: float  # counting DPO's slowdown


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _estimate(facts: FileFacts, model: str) -> int:
    return facts.token_estimates.get(model, facts.token_upper_bound)


@dataclass(frozen=True)
class Generation:
    """What a reinforcement job generates besides what it trains."""

    completions: int  # generated completion tokens over every epoch (upper side)
    grader_tokens: int  # model graders' prompt and answer tokens
    evaluations: int  # validation evaluations, before and after included
    eval_tokens: int  # tokens generated for them


def reinforcement_generation(spec: JobSpec, training: FileFacts, validation: FileFacts | None) -> Generation:
    from graders.model_graders import DEFAULT_MAX_TOKENS
    from jobs.reinforcement import uses_model_graders

    k, completion = spec.samples_per_prompt, spec.max_completion_tokens
    completions = training.rows * k * completion * spec.n_epochs
    per_grade = GRADER_PROMPT_TOKENS + completion + DEFAULT_MAX_TOKENS
    graded = completions // completion * per_grade if uses_model_graders(spec.grader) else 0
    steps = _ceil_div(training.rows, spec.batch_size) * spec.n_epochs
    evaluations = 2 + steps // spec.eval_interval
    eval_rows = eval_rows_for(spec, training, validation)
    return Generation(completions, graded, evaluations, evaluations * eval_rows * spec.eval_samples * completion)


def estimate_workload(
    spec: JobSpec, training: FileFacts, validation: FileFacts | None, time_limit_s: float = TIME_LIMIT_SECONDS
) -> Workload:
    if spec.method_type == "reinforcement":
        return _reinforcement_workload(spec, training, validation, time_limit_s)
    base = get_base(spec.model)
    fit = base.fit_tokens[spec.adapter]
    slowdown = DPO_SLOWDOWN if spec.method_type == "dpo" else 1
    per_epoch = _estimate(training, spec.model)
    eval_rows = eval_rows_for(spec, training, validation)
    if validation is not None:
        eval_tokens = _estimate(validation, spec.model)
    else:
        eval_tokens = _ceil_div(per_epoch * eval_rows, training.rows)
    # seconds = tokens x slowdown / (fit / limit), in integers so the refusal and the quote agree.
    eval_seconds = _ceil_div(eval_tokens * slowdown * EVAL_PASSES * FIT_SECONDS, EVAL_SPEEDUP * fit)
    train_seconds = _ceil_div(per_epoch * spec.n_epochs * slowdown * FIT_SECONDS, fit)
    budget = max(int(time_limit_s) - STARTUP_SECONDS - eval_seconds, 0)
    return Workload(
        tokens_per_epoch=per_epoch,
        training_tokens=per_epoch * spec.n_epochs,
        eval_rows=eval_rows,
        eval_tokens=eval_tokens,
        eval_seconds=eval_seconds,
        train_seconds=train_seconds,
        seconds=STARTUP_SECONDS + eval_seconds + train_seconds,
        fit_tokens=budget * fit // (FIT_SECONDS * slowdown),
        tokens_per_second=fit / FIT_SECONDS / slowdown,
    )


def _reinforcement_workload(spec: JobSpec, training: FileFacts, validation: FileFacts | None,
                            time_limit_s: float) -> Workload:
    fit = get_base(spec.model).fit_tokens[spec.adapter]
    gen = reinforcement_generation(spec, training, validation)
    k = spec.samples_per_prompt
    per_epoch = k * (_estimate(training, spec.model) + training.rows * spec.max_completion_tokens)
    eval_rows = eval_rows_for(spec, training, validation)
    # Trained tokens once forward and backward plus the reference forward (a third), then generation.
    train_work = per_epoch * spec.n_epochs * 4 + (gen.completions + gen.grader_tokens) * GENERATION_SLOWDOWN * 3
    train_seconds = _ceil_div(train_work * FIT_SECONDS, 3 * fit)
    eval_seconds = _ceil_div(gen.eval_tokens * GENERATION_SLOWDOWN * FIT_SECONDS, fit)
    budget = max(int(time_limit_s) - STARTUP_SECONDS - eval_seconds, 0)
    # The trained tokens that fit, at this job's mix of training and generation per trained token.
    per_token_seconds = train_seconds / max(per_epoch * spec.n_epochs, 1)
    return Workload(
        tokens_per_epoch=per_epoch, training_tokens=per_epoch * spec.n_epochs, eval_rows=eval_rows,
        eval_tokens=gen.eval_tokens, eval_seconds=eval_seconds, train_seconds=train_seconds,
        seconds=STARTUP_SECONDS + eval_seconds + train_seconds,
        fit_tokens=int(budget / per_token_seconds) if per_token_seconds else 0,
        tokens_per_second=per_epoch * spec.n_epochs / max(train_seconds, 1),
    )


def _usd(tokens: int, rate: float, rounding: str) -> Decimal:
    return (Decimal(tokens) * Decimal(str(rate)) / 1_000_000).quantize(CENT, rounding=rounding)


def quote_job(
    spec: JobSpec, training: FileFacts, validation: FileFacts | None, prices: PriceTable, *,
    time_limit_s: float = TIME_LIMIT_SECONDS,
) -> Quote:
    """The quote; raises `InvalidRequest(code="job_too_large")` when the job cannot fit the time limit
    (the service's `job_time_limit_seconds`; the reference's 2 hours by default)."""
    base = get_base(spec.model)
    work = estimate_workload(spec, training, validation, time_limit_s)
    if work.training_tokens > work.fit_tokens:
        raise _too_large(spec, base, training, validation, work, time_limit_s)
    rate = prices.trained_usd_per_mtok(spec.model, spec.method_type)
    upper = training.token_upper_bound * spec.n_epochs
    extra = None
    if spec.method_type == "reinforcement":
        gen = reinforcement_generation(spec, training, validation)
        upper = spec.samples_per_prompt * (training.token_upper_bound + training.rows * spec.max_completion_tokens)
        upper *= spec.n_epochs
        extra = {"samples_per_prompt": spec.samples_per_prompt, "generated_tokens": gen.completions + gen.eval_tokens,
                 "grader_tokens": gen.grader_tokens, "evaluations": gen.evaluations}
    minimum = Decimal(str(prices.minimum_usd)).quantize(CENT, rounding=ROUND_CEILING)
    max_charge = max(_usd(upper, rate, ROUND_CEILING), minimum)
    long_context = spec.method_type != "supervised" or spec.max_seq_length > 2048
    return Quote(
        training_tokens_upper_bound=upper,
        training_tokens_per_epoch_upper_bound=training.token_upper_bound,
        n_epochs=spec.n_epochs,
        eval_rows=work.eval_rows,
        estimated_seconds=work.seconds,
        estimated_usd=float(_usd(work.training_tokens, rate, ROUND_HALF_UP)),
        basis=_basis(spec, base, validation, work, rate, training.token_upper_bound),
        per_token=PerToken(trained_usd_per_mtok=rate, minimum_usd=float(minimum), max_charge_usd=float(max_charge)),
        gpu_memory_class_gb=max(base.gpu_memory_class_gb, LARGE_GPU_GB) if long_context else base.gpu_memory_class_gb,
        reinforcement=extra,
    )


def _limit(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g}-hour" if hours == int(hours) else f"{seconds:.0f}-second"


def _epochs(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def _duration(seconds: int) -> str:
    hours, minutes = divmod(_ceil_div(seconds, 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def _speed(spec: JobSpec, work: Workload) -> str:
    dpo = {"dpo": ", half speed for DPO", "reinforcement": ", sampling and training"}.get(spec.method_type, "")
    return f"{work.tokens_per_second:,.0f} tokens per second ({spec.adapter}{dpo})"


def _basis(spec: JobSpec, base: BaseModelSpec, validation: FileFacts | None, work: Workload, rate: float, upper: int) -> str:
    eval_source = "validation rows" if validation is not None else "held-out rows"
    return (
        f"{work.tokens_per_epoch:,} training tokens per epoch, counted with {base.id}'s estimate from the file's text "
        f"(at or above the real count), x {_epochs(spec.n_epochs)}, trained at {_speed(spec, work)}, plus "
        f"{STARTUP_SECONDS} s to start and {work.eval_seconds} s to evaluate {work.eval_rows:,} {eval_source} before "
        f"and after training. Charged for the tokens trained x epochs at {rate:.2f} USD per million, at least the "
        f"minimum and at most the charge at {upper:,} tokens per epoch, the upper bound from the file's bytes."
    )


def _too_large(
    spec: JobSpec, base: BaseModelSpec, training: FileFacts, validation: FileFacts | None, work: Workload,
    time_limit_s: float,
) -> InvalidRequest:
    changes = []
    epochs_that_fit = work.fit_tokens // max(work.tokens_per_epoch, 1)
    if spec.n_epochs > 1 and epochs_that_fit >= 1:
        changes.append(f"lower n_epochs to {epochs_that_fit}")
    rows_that_fit = training.rows * work.fit_tokens // work.training_tokens
    changes.append(f"keep at most about {rows_that_fit:,} of the {training.rows:,} rows")
    if base.fit_tokens.get("lora", 0) > base.fit_tokens[spec.adapter]:
        changes.append("use method lora, which trains faster than qlora")
    if validation is not None:
        changes.append("use a smaller validation_file")
    changes.append("choose a smaller base")
    return InvalidRequest(
        f"This job is estimated at {work.training_tokens:,} training tokens ({work.tokens_per_epoch:,} per epoch x "
        f"{_epochs(spec.n_epochs)}) on {base.id} at {_speed(spec, work)}: about {_duration(work.seconds)} "
        f"({work.seconds:,} s), over the {_limit(time_limit_s)} limit. At most {work.fit_tokens:,} training tokens fit, counting every "
        f"epoch, once startup and evaluation are counted. To fit, {', '.join(changes[:-1])} or {changes[-1]}.",
        code="job_too_large",
        param="training_file",
    )
