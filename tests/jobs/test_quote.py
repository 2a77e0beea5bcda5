"""The quote's figures, worked by hand for fixed file facts, and the `job_too_large` refusal."""

from __future__ import annotations

import pytest

from catalog.bases import unpriced
from entrypoints.preflight import _prices
from jobs.params import JobSpec, parse_create_request
from jobs.quote import PerToken, Quote, estimate_workload, quote_job
from openft.errors import InvalidRequest
from openft.pricing import DEFAULT_RATES, PriceTable
from openft.settings import Settings

from . import file_facts

PRICES = PriceTable()


def job(model: str = "qwen2.5-7b-instruct", **body) -> JobSpec:
    return parse_create_request({"model": model, "training_file": "file-train", **body}, seed_factory=lambda: 1)


def dpo(model: str = "qwen2.5-7b-instruct", **hp) -> JobSpec:
    return job(model, method={"type": "dpo", "dpo": {"hyperparameters": hp}})


def refusal(spec: JobSpec, training, validation=None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        quote_job(spec, training, validation, PRICES)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "job_too_large", "training_file")
    return caught.value


def test_supervised_quote():
    # 1,000,000 tokens x 3 epochs at 5,280,000 / 7200 tokens per second: 4,090.9 s -> 4,091;
    # holdout 100 rows = 50,000 tokens, twice, at 3x speed: 45.5 s -> 46; plus 120 s to start.
    quote = quote_job(job(hyperparameters={"n_epochs": 3}), file_facts(), None, PRICES)
    assert quote == Quote(
        training_tokens_upper_bound=3_900_000,
        training_tokens_per_epoch_upper_bound=1_300_000,
        n_epochs=3,
        eval_rows=100,
        estimated_seconds=4257,
        estimated_usd=6.00,
        basis=(
            "1,000,000 training tokens per epoch, counted with qwen2.5-7b-instruct's estimate from the file's text "
            "(at or above the real count), x 3 epochs, trained at 733 tokens per second (lora), plus 120 s to start "
            "and 46 s to evaluate 100 held-out rows before and after training. Charged for the tokens trained x epochs "
            "at 2.00 USD per million, at least the minimum and at most the charge at 1,300,000 tokens per epoch, the "
            "upper bound from the file's bytes."
        ),
        per_token=PerToken(trained_usd_per_mtok=2.00, minimum_usd=0.50, max_charge_usd=7.80),
        estimate=True,
        gpu_memory_class_gb=48,
    )
    assert quote.estimated_finish(1_800_000_000) == 1_800_004_257
    assert quote.model_dump()["estimate"] is True


def test_dpo_quote_counts_tokens_twice_for_time_and_once_for_the_charge():
    # Training 2,000,000 x 2 / 733.3 = 5,454.5 -> 5,455 s; eval 50,000 x 2 x 2 at 3x = 90.9 -> 91 s.
    quote = quote_job(dpo(n_epochs=2), file_facts(row_kind="preference"), None, PRICES)
    assert (quote.estimated_seconds, quote.estimated_usd, quote.training_tokens_upper_bound) == (5666, 8.00, 2_600_000)
    assert quote.per_token == PerToken(trained_usd_per_mtok=4.00, minimum_usd=0.50, max_charge_usd=10.40)
    assert "367 tokens per second (lora, half speed for DPO)" in quote.basis


def test_validation_file_sets_eval_rows_and_eval_time():
    validation = file_facts(id="file-v", rows=300, token_estimates={"qwen2.5-7b-instruct": 200_000})
    quote = quote_job(job(validation_file="file-v"), file_facts(), validation, PRICES)
    # eval 200,000 x 2 at 3x: 181.8 -> 182 s; training 1,363.6 -> 1,364 s.
    assert (quote.eval_rows, quote.estimated_seconds, quote.estimated_usd) == (300, 1666, 2.00)
    assert "182 s to evaluate 300 validation rows" in quote.basis


def test_small_job_estimates_below_the_minimum_it_is_charged():
    training = file_facts(rows=200, token_upper_bound=130_000, token_estimates={"qwen2.5-0.5b-instruct": 100_000})
    quote = quote_job(job("qwen2.5-0.5b-instruct"), training, None, PRICES)
    assert (quote.estimated_seconds, quote.estimated_usd, quote.eval_rows, quote.gpu_memory_class_gb) == (166, 0.04, 10, 24)
    assert quote.per_token == PerToken(trained_usd_per_mtok=0.40, minimum_usd=0.50, max_charge_usd=0.50)


def test_dpo_and_long_context_train_on_48_gb():
    training = file_facts(row_kind="preference", token_estimates={"qwen2.5-0.5b-instruct": 100_000})
    assert quote_job(dpo("qwen2.5-0.5b-instruct"), training, None, PRICES).gpu_memory_class_gb == 48
    long = job("qwen3-8b", hyperparameters={"max_seq_length": 8192})
    assert quote_job(long, file_facts(token_estimates={"qwen3-8b": 1000}), None, PRICES).gpu_memory_class_gb == 48


def test_file_without_estimates_counts_its_upper_bound_and_rounds_money():
    # 1,232,000 tokens at 2.00: 2.464 USD, 2.46 estimated (half up) and 2.47 the most charged (up).
    quote = quote_job(job(), file_facts(token_upper_bound=1_232_000, token_estimates={}), None, PRICES)
    assert (quote.estimated_seconds, quote.estimated_usd, quote.per_token.max_charge_usd) == (1856, 2.46, 2.47)


def test_the_limit_is_exact_at_the_fit_count():
    # qwen2.5-0.5b-instruct trains 2,291.7 tokens per second; evaluation of 100,000 tokens takes
    # 29.1 -> 30 s, leaving 7,050 s: 16,156,250 training tokens fit.
    validation = file_facts(id="file-v", rows=200, token_estimates={"qwen2.5-0.5b-instruct": 100_000})
    spec = job("qwen2.5-0.5b-instruct", validation_file="file-v")

    def training(tokens: int):
        return file_facts(rows=100_000, token_upper_bound=tokens, token_estimates={"qwen2.5-0.5b-instruct": tokens})

    assert estimate_workload(spec, training(1), validation).fit_tokens == 16_156_250
    assert quote_job(spec, training(16_156_250), validation, PRICES).estimated_seconds == 7200
    exc = refusal(spec, training(16_156_251), validation)
    assert "about 2 h 1 min (7,201 s), over the 2-hour limit. At most 16,156,250 training tokens fit" in exc.message
    assert "use a smaller validation_file" in exc.message


def test_job_too_large_gives_the_limit_duration_fit_and_fix():
    # 24,000 rows at about 83 estimated tokens each, 3 epochs: 6,000,000 training tokens.
    training = file_facts(rows=24_000, bytes=30_000_000, token_upper_bound=2_600_000,
                          token_estimates={"qwen2.5-7b-instruct": 2_000_000})
    exc = refusal(job(hyperparameters={"n_epochs": 3}), training)
    assert exc.message == (
        "This job is estimated at 6,000,000 training tokens (2,000,000 per epoch x 3 epochs) on qwen2.5-7b-instruct "
        "at 733 tokens per second (lora): about 2 h 20 min (8,378 s), over the 2-hour limit. At most 5,136,266 "
        "training tokens fit, counting every epoch, once startup and evaluation are counted. To fit, lower n_epochs "
        "to 2, keep at most about 20,545 of the 24,000 rows or choose a smaller base."
    )


def test_qlora_refusal_suggests_lora_that_fits():
    training = file_facts(token_estimates={"llama-3.1-8b-instruct": 1_000_000})
    exc = refusal(job("llama-3.1-8b-instruct", method="qlora", hyperparameters={"n_epochs": 2}), training)
    assert "use method lora, which trains faster than qlora" in exc.message
    lora = quote_job(job("llama-3.1-8b-instruct", hyperparameters={"n_epochs": 2}), training, None, PRICES)
    assert lora.estimated_usd == 4.40


def test_dpo_fits_half_as_much():
    # 2,000,000 tokens x 2 epochs: as supervised, as long as the 1,000,000-token DPO job above; as DPO, twice that.
    facts = dict(token_upper_bound=2_600_000, token_estimates={"qwen2.5-7b-instruct": 2_000_000})
    assert quote_job(job(hyperparameters={"n_epochs": 2}), file_facts(**facts), None, PRICES).estimated_seconds == 5666
    exc = refusal(dpo(n_epochs=2), file_facts(row_kind="preference", **facts))
    assert "half speed for DPO): about 3 h 7 min (11,212 s)" in exc.message
    assert "At most 2,529,266 training tokens fit" in exc.message


def test_price_table():
    assert PRICES.trained_usd_per_mtok("gpt-oss-20b", "supervised") == 4.00
    assert PRICES.trained_usd_per_mtok("qwen3.5-9b", "dpo") == 5.20
    assert all(rate.dpo_usd_per_mtok == round(2 * rate.supervised_usd_per_mtok, 2) for rate in DEFAULT_RATES.values())
    partial = {"qwen3-8b": {"supervised_usd_per_mtok": 1.0, "dpo_usd_per_mtok": 2.0}}
    # The catalog's check, which `openft serve` runs before it starts (the core imports no catalog).
    assert unpriced(PriceTable(rates=partial).rates)[0] == "qwen2.5-0.5b-instruct" and "qwen3-8b" not in unpriced(
        PriceTable(rates=partial).rates)
    assert _prices(Settings(prices=PriceTable(rates=partial))).startswith(
        "OPENFT_PRICES: the price table has no rate for: qwen2.5-0.5b-instruct")
    assert unpriced(PRICES.rates) == [] and _prices(Settings()) is None
    custom = PriceTable.model_validate_json(PriceTable(minimum_usd=1.25).model_dump_json())
    assert quote_job(job(), file_facts(), None, custom).per_token.max_charge_usd == 2.60
    tiny = file_facts(token_upper_bound=1000, token_estimates={"qwen2.5-7b-instruct": 1000})
    assert quote_job(job(), tiny, None, custom).per_token.max_charge_usd == 1.25


def test_the_time_limit_setting_decides_what_fits_not_the_speed():
    """The quote counts the service's `job_time_limit_seconds`, not a hard-coded 7,200 s; the
    catalog's fit tokens stay a speed."""
    spec, facts = job(hyperparameters={"n_epochs": 3}), file_facts()
    two_hours, one_hour = estimate_workload(spec, facts, None), estimate_workload(spec, facts, None, 3600)
    fit = 5_280_000  # qwen2.5-7b-instruct, lora: tokens per 7,200 s
    assert two_hours.fit_tokens == (7200 - 120 - 46) * fit // 7200
    assert one_hour.fit_tokens == (3600 - 120 - 46) * fit // 7200
    assert (one_hour.seconds, one_hour.tokens_per_second) == (two_hours.seconds, two_hours.tokens_per_second)
    assert quote_job(spec, facts, None, PRICES).estimated_seconds == 4257  # fits 2 hours
    with pytest.raises(InvalidRequest) as caught:
        quote_job(spec, facts, None, PRICES, time_limit_s=3600)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "job_too_large", "training_file")
    assert "over the 1-hour limit" in caught.value.message


def rft(model: str = "qwen2.5-7b-instruct", grader: dict | None = None, **hp) -> JobSpec:
    grader = grader or {"type": "string_check", "name": "g", "input": "{{sample.output_text}}",
                        "reference": "{{item.answer}}", "operation": "eq"}
    return job(model, method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": hp}})


def test_reinforcement_quote_counts_sampling_and_training():
    # 100 prompts (estimate 20,000 tokens), 8 samples of at most 256 tokens each: 8 x (20,000 + 25,600)
    # = 364,800 trained tokens; 204,800 generated. Work: 364,800 x 4/3 (the reference forward) +
    # 204,800 x 4 (generation) = 1,305,600 training-token equivalents at 733.3 per second: 1,781 s.
    # Evaluations: before, after and 13 // 10 = 1 between, each 5 held-out prompts x 1 sample x 256
    # tokens generated: 3,840 x 4 at 733.3 per second: 21 s. Charged at the DPO rate (4.00).
    facts = file_facts(rows=100, row_kind="reinforcement", token_upper_bound=30_000,
                       token_estimates={"qwen2.5-7b-instruct": 20_000})
    quote = quote_job(rft(), facts, None, PRICES)
    assert (quote.training_tokens_upper_bound, quote.training_tokens_per_epoch_upper_bound) == (8 * 55_600, 30_000)
    assert (quote.estimated_seconds, quote.eval_rows) == (120 + 21 + 1781, 5)
    assert (quote.estimated_usd, quote.per_token.trained_usd_per_mtok, quote.per_token.max_charge_usd) == (1.46, 4.0, 1.78)
    assert quote.reinforcement == {"samples_per_prompt": 8, "generated_tokens": 204_800 + 3_840, "grader_tokens": 0,
                                   "evaluations": 3}
    assert quote.gpu_memory_class_gb == 48
    # Half the samples: half the trained and generated tokens.
    half = quote_job(rft(compute_multiplier=0.5), facts, None, PRICES)
    assert half.training_tokens_upper_bound == 4 * 55_600 and half.reinforcement["samples_per_prompt"] == 4


def test_reinforcement_quote_counts_model_graders_and_refuses_what_does_not_fit():
    judge = {"type": "score_model", "name": "j", "model": "qwen2.5-7b-instruct",
             "input": [{"role": "user", "content": "{{sample.output_text}} vs {{item.answer}}"}]}
    facts = file_facts(rows=100, row_kind="reinforcement", token_upper_bound=30_000,
                       token_estimates={"qwen2.5-7b-instruct": 20_000})
    quote = quote_job(rft(grader=judge), facts, None, PRICES)
    assert quote.reinforcement["grader_tokens"] == 100 * 8 * (512 + 256 + 128)
    err = refusal(rft(), file_facts(row_kind="reinforcement"))  # 2,000 prompts x 8 samples: far past 2 hours
    assert "over the 2-hour limit" in err.message
