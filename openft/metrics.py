"""The service's own metrics, exported through Ray (`ray.util.metrics`): each Ray process that
records one reports it to its node's metrics agent, which serves them in Prometheus text on the
node's metrics export port (`ray start --metrics-export-port`), beside Ray's own, with Ray's
`ray_` prefix (`ray_openft_jobs`).

Where it sits: the shared core; the layers call the `record_*`/`set_*` functions below at the one
place each figure is known (the controller's pass, a run's start and end, upload validation, a
merge, a batch, an online replica). Every figure is recorded by a long-lived process (the job controller actor, the
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
ONLINE_FIRST_TOKEN = "openft_online_time_to_first_token_seconds"
ONLINE_TOKENS_PER_S = "openft_online_tokens_per_second"
ONLINE_QUEUE = "openft_online_queue_depth"
ONLINE_ADAPTERS = "openft_online_adapter_events"

_SECONDS = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400]
_TOKENS_PER_S = [10, 50, 100, 500, 1000, 5000, 10_000, 50_000, 100_000, 500_000]
_MB_PER_S = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500]
_GB_PER_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10]
_FIRST_TOKEN_S = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120]

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
    ONLINE_FIRST_TOKEN: ("histogram", "Seconds from an online chat completion's arrival at its base's replica to its "
                         "first token (queueing, adapter load and prefill).", ("model",), _FIRST_TOKEN_S),
    ONLINE_TOKENS_PER_S: ("histogram", "Completion tokens per second of one online chat completion, arrival to end.",
                          ("model",), _TOKENS_PER_S),
    ONLINE_QUEUE: ("gauge", "Online chat completions waiting for a place in their replica's batch.", ("model",), None),
    ONLINE_ADAPTERS: ("counter", "Adapters loaded onto a replica's base (event=load) and evicted from its cache, "
                      "least recently used first (event=eviction).", ("model", "event"), None),
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
            elif kind == "counter":
                _made[name] = metrics.Counter(name, description=description, tag_keys=tag_keys)
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


# -- online chat completions (issue 27), recorded by the bases' online replicas --
def record_online_first_token(seconds: float, *, model: str) -> None:
    _observe(ONLINE_FIRST_TOKEN, max(0.0, seconds), model=model)


def record_online_tokens(completion_tokens: int, seconds: float, *, model: str) -> None:
    rate = _rate(completion_tokens, seconds)
    if rate is not None:
        _observe(ONLINE_TOKENS_PER_S, rate, model=model)


def set_online_queue_depth(depth: int, *, model: str) -> None:
    metric = _metric(ONLINE_QUEUE)
    if metric is not None:
        metric.set(depth, tags={"model": model})


def count_online_adapters(kind: str, count: int, *, model: str) -> None:
    """`kind`: "loads" or "evictions"; `count` new ones since the last report."""
    metric = _metric(ONLINE_ADAPTERS)
    if metric is not None and count > 0:
        metric.inc(count, tags={"model": model, "event": kind.removesuffix("s")})
