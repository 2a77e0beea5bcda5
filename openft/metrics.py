"""The service's own metrics, exported through Ray (`ray.util.metrics`): each Ray process that
records one reports it to its node's metrics agent, which serves them in Prometheus text on the
node's metrics export port (`ray start --metrics-export-port`), beside Ray's own, with Ray's
`ray_` prefix (`ray_openft_jobs`).

Where it sits: the shared core; the layers call the `record_*`/`set_*` functions below at the one
place each figure is known (the controller's pass, a run's start and end, upload validation, a
merge, a batch). Every figure is recorded by a long-lived process (the job controller actor, the
API's Serve replicas), not by a Ray Train worker: a worker that ends seconds after recording
can die before the agent's next collection, and its figure would be lost.

Tags are bounded sets (a job status, a base model id), never a job, file or account id: Ray keeps
every tag set a process recorded until the process ends.

The metric objects are created on first use inside the recording process (Ray metrics are bound
to the process's Ray core worker), and recording is a no-op where Ray is not initialised (the
unit tests that drive the controller's passes without a cluster).
"""

from __future__ import annotations

import threading

JOBS = "openft_jobs"
QUEUE_WAIT = "openft_job_queue_wait_seconds"
FIRST_STEP = "openft_train_time_to_first_step_seconds"
TRAIN_TOKENS_PER_S = "openft_train_tokens_per_second"
UPLOAD_MB_PER_S = "openft_upload_validation_mb_per_second"
MERGE_GB_PER_S = "openft_merge_gb_per_second"
BATCH_TOKENS_PER_S = "openft_batch_output_tokens_per_second"

_SECONDS = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400]
_TOKENS_PER_S = [10, 50, 100, 500, 1000, 5000, 10_000, 50_000, 100_000, 500_000]
_MB_PER_S = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500]
_GB_PER_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10]

# name -> (kind, description, tag keys, histogram boundaries)
_DEFINITIONS = {
    JOBS: ("gauge", "Fine-tuning jobs by status, counted in the database on each controller pass.", ("status",), None),
    QUEUE_WAIT: ("histogram", "Seconds from entering the wait (validating_files or queued) to the run's start.",
                 ("model",), _SECONDS),
    FIRST_STEP: ("histogram", "Seconds from a run's start to its first training step (tokenizing, workers, "
                 "model load), for runs that succeeded.", ("model",), _SECONDS),
    TRAIN_TOKENS_PER_S: ("histogram", "Trained tokens per second of training-loop time, per succeeded run.",
                         ("model",), _TOKENS_PER_S),
    UPLOAD_MB_PER_S: ("histogram", "MB (10^6 bytes) per second of the Ray Data validation of an upload's part "
                      "past the inline threshold.", (), _MB_PER_S),
    MERGE_GB_PER_S: ("histogram", "GB (10^9 bytes) of export written per second of merge, per succeeded merge.",
                     ("model",), _GB_PER_S),
    BATCH_TOKENS_PER_S: ("histogram", "Generated (completion) tokens per second of a batch's run.",
                         ("model",), _TOKENS_PER_S),
}

_made: dict[str, object] = {}
_lock = threading.Lock()


def _metric(name: str):
    """The process's metric object for `name`, or None where Ray is not initialised."""
    import ray

    if not ray.is_initialized():
        return None
    with _lock:
        if name not in _made:
            from ray.util import metrics

            kind, description, tag_keys, boundaries = _DEFINITIONS[name]
            if kind == "gauge":
                _made[name] = metrics.Gauge(name, description=description, tag_keys=tag_keys)
            else:
                _made[name] = metrics.Histogram(name, description=description, boundaries=boundaries,
                                                tag_keys=tag_keys)  # fmt: skip
        return _made[name]


def _observe(name: str, value: float, **tags: str) -> None:
    metric = _metric(name)
    if metric is not None:
        metric.observe(value, tags=tags or None)


def _rate(amount: float, seconds: float) -> float | None:
    return amount / seconds if seconds > 0 and amount > 0 else None


def set_jobs_by_status(counts: dict[str, int]) -> None:
    """`counts` has every status (storage/jobs.py `count_by_status`), so a count that fell to 0 shows 0."""
    metric = _metric(JOBS)
    if metric is not None:
        for status, count in counts.items():
            metric.set(count, tags={"status": status})


def record_queue_wait(seconds: float, *, model: str) -> None:
    _observe(QUEUE_WAIT, max(0.0, seconds), model=model)


def record_run(*, model: str, first_step_s: float | None, trained_tokens: int | None, loop_s: float | None) -> None:
    """A succeeded run's figures: time to its first step, and trained tokens per second."""
    if first_step_s is not None:
        _observe(FIRST_STEP, max(0.0, first_step_s), model=model)
    rate = _rate(trained_tokens or 0, loop_s or 0)
    if rate is not None:
        _observe(TRAIN_TOKENS_PER_S, rate, model=model)


def record_upload_validation(nbytes: int, seconds: float) -> None:
    rate = _rate(nbytes / 1e6, seconds)
    if rate is not None:
        _observe(UPLOAD_MB_PER_S, rate)


def record_merge(nbytes: int, seconds: float, *, model: str) -> None:
    rate = _rate(nbytes / 1e9, seconds)
    if rate is not None:
        _observe(MERGE_GB_PER_S, rate, model=model)


def record_batch(completion_tokens: int, seconds: float, *, model: str) -> None:
    rate = _rate(completion_tokens, seconds)
    if rate is not None:
        _observe(BATCH_TOKENS_PER_S, rate, model=model)
