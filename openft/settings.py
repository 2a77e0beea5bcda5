"""The one settings object, read at entry points (CLI, deployment builder) and passed down.

Library code never reads the environment: Ray tasks and actors receive a `Settings` (it is a
plain pydantic model, so it pickles) as an explicit argument.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, IPvAnyNetwork, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from openft.pricing import PriceTable


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OPENFT_", extra="ignore")

    data_dir: Path = Field(Path(".openft"), description="Local state: SQLite file, objects, Ray temp dir, stand-ins.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default a SQLite file (WAL) in the data dir. PostgreSQL: postgresql+psycopg://..."
    )
    storage_url: str | None = Field(
        None, description="file:///abs/dir or s3://bucket/prefix; default file://<data dir>/objects."
    )
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, R2, SeaweedFS); None = AWS.")
    s3_region: str = Field("us-east-1", description="Region used to sign S3 requests.")
    ray_address: str | None = Field(
        None,
        validation_alias=AliasChoices("OPENFT_RAY_ADDRESS", "RAY_ADDRESS"),
        description="Join this Ray cluster instead of starting a local one.",
    )
    model_source: str = Field(
        "hub", description="Where base weights come from: hub | dir:/path/to/mirror | standin (tiny generated bases)."
    )
    validate_ray_threshold_bytes: int = Field(
        8 * 1024 * 1024, description="Uploads above this size have their remaining lines validated by a Ray Data job."
    )
    validate_block_bytes: int = Field(8 * 1024 * 1024, description="Byte range one Ray Data create-check task reads.")
    tokenize_ray_threshold_bytes: int = Field(
        8 * 1024 * 1024,
        description="A job whose training and validation files are at most this size is tokenized in its run's own "
        "process and its Train workers read the tokenized rows from the store; a larger one is tokenized by Ray Data "
        "tasks and read through Ray Data datasets.",
    )
    validate_range_bytes_max: int = Field(
        64 * 1024 * 1024,
        description="Largest byte range one Ray Data upload-validation task reads: the part of an upload past the inline "
        "check is split evenly over the cluster's CPUs, in ranges up to this size.",
    )
    file_retention_days: int = Field(30, description="Uploaded and derived files expire this long after creation.")
    new_account_open_jobs: int = Field(1, description="Open fine-tuning jobs allowed to a new account.")
    established_account_open_jobs: int = Field(
        3, description="Open jobs allowed once an account's first deposit lands, unless its limit was set explicitly."
    )
    models_per_account: int = Field(100, description="Fine-tuned models per account; each open job reserves one.")
    usd_per_day_limit: float = Field(
        100.0, description="Default USD an account may commit to jobs per UTC day (billing on); deposits do not raise it."
    )
    billing_enabled: bool = Field(
        False,
        description="Credit holds and per-token charges (docs/billing.md). Off by default so the embedded "
        "laptop setup trains without deposits; production sets OPENFT_BILLING_ENABLED=true.",
    )
    api_keys_per_account: int = Field(
        20, ge=1, description="Working API keys (not revoked, not expired) one account may hold; another create "
        "answers 429 limit_exceeded.",
    )
    admin_key: str | None = Field(
        None, description="Bearer key of the admin API (/v1/gridline/admin); unset, that API answers 404."
    )
    run_copy_retention_days: int = Field(7, description="Tokenized shards and checkpoints kept after a run ends.")
    job_retention_days: int = Field(180, description="Jobs and their events kept after they end.")
    prices: PriceTable = Field(default_factory=PriceTable, description="Per-base rates (OPENFT_PRICES as JSON).")
    train_use_gpu: bool = Field(False, description="Train workers take a GPU (production: one 48 GB-class GPU each).")
    train_worker_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1},
        description='Ray resources per Train worker, e.g. {"GPU": 1, "gpu_48gb": 1} with a custom resource on 48 GB nodes.',
    )
    train_num_workers: int = Field(
        1,
        ge=1,
        description="Ray Train workers per job, data parallel: each trains a slice of every batch (batch_size is the "
        "global batch), placed on different nodes where it can. `openft serve` refuses a value the cluster's nodes "
        "cannot place (train_worker_resources each).",
    )
    max_concurrent_runs: int = Field(1, description="Training runs the controller keeps going at once.")
    controller_poll_seconds: float = Field(1.0, description="How often the job controller looks for work.")
    controller_sweep_seconds: float = Field(
        5.0,
        gt=0,
        description="How often the job controller cleans up after ended work (expired exports' objects, ended batches' "
        "stages, stopped runs' placement groups) and updates the openft_jobs gauge.",
    )
    train_data_cpus: float = Field(
        1.0,
        description="CPUs the controller keeps free beside the Train workers for the Ray Data tasks that feed them; "
        "a run whose reads find no CPU never steps.",
    )
    run_lease_seconds: float = Field(
        30.0,
        description="A run's lease on its job, renewed by its heartbeat: a run whose lease lapses this long is lost, "
        "and its job is queued again from its last checkpoint.",
    )
    run_stall_seconds: float = Field(
        1800.0,
        description="A run that writes no event or metrics for this long (a hung step, a starved read) is stopped and "
        "fails training_failed. Covers model download and tokenization, so keep it above the longest silent phase.",
    )
    db_outage_seconds: float = Field(
        120.0, description="How long a run and the controller retry a database that is unreachable before giving up."
    )
    job_time_limit_seconds: float = Field(
        7200.0,
        description="A job's runs, from each start (model load, tokenization, evals, training) to its end, summed over "
        "its attempts, must take no longer than this: past it the run is stopped and fails time_limit_exceeded.",
    )
    capacity_wait_limit_seconds: float = Field(
        86400.0, description="A job that cannot start within this long fails with job_unavailable."
    )
    # -- the distill shortcut in the background (issue 12) --
    max_concurrent_distills: int = Field(
        1,
        description="Jobs created on a batch results file that the controller distills at once (each a Ray Data "
        "job reading the results and requests files); the others wait in validating_files.",
    )
    # -- batches (issue 13) --
    new_account_open_batches: int = Field(
        2, description="Open batches (validating, in_progress, finalizing, cancelling) one account may have; another "
        "create answers 429 limit_exceeded with the limit in error.limit.",
    )
    batch_completion_window_seconds: float = Field(
        86400.0, description="What completion_window 24h means: a batch not done this long after create expires "
        "(its finished lines are kept). Tests shorten it.",
    )
    max_concurrent_batches: int = Field(
        1, description="Batches and eval runs the controller runs at once, together. Their engine actors also count against the cluster's "
        "capacity that training runs use (jobs/scheduling.py), so neither oversubscribes the other.",
    )
    reaper_interval_seconds: float = Field(300.0, description="How often expired objects are reaped.")
    merge_deadline_seconds: float = Field(900.0, description="A merge attempt running longer is stopped (merge_timeout).")
    # -- uploads (POST /v1/files) and per-account file limits --------------------------------------
    account_max_files: int = Field(
        1000,
        description="Live files (not deleted, not expired) one account may hold; uploads, distilled files and job "
        "results files all count. An upload or distillation past it is refused 429 limit_exceeded; a finished job's "
        "results file is still stored (the run is done), and counts against later uploads.",
    )
    account_max_file_bytes: int = Field(
        100 * 10**9, description="Total bytes of one account's live files (100 GB); counted and enforced as account_max_files."
    )
    upload_max_form_fields: int = Field(
        16, description="Parts one multipart upload may have, its file included; more are refused 400 too_many_fields."
    )
    upload_drain_bytes: int = Field(
        1 << 20,
        description="After refusing an upload, read and drop up to this much more of its body so that the client "
        "reads the refusal; a longer rest is left unread and the refusal closes the connection.",
    )
    signing_secret: str | None = Field(
        None,
        description="The secret the service's own keys are derived from (openft/sealing.py): the download URLs' "
        "tokens (local storage) and the webhook signing secrets stored in the database are encrypted with them; "
        "default a random key kept in the data dir. Set it when API replicas and the controller do not share a data "
        "dir; changing it invalidates download links and makes the stored webhook secrets unreadable.",
    )

    # -- API surface (issue 12): who may read the API docs, and the base of the URLs redirects name --
    api_docs_public: bool = Field(
        False,
        description="Serve /openapi.json, /docs and /redoc without a key. Off: they need a valid account key "
        "(Authorization: Bearer), like every /v1 route; a browser sends none, so a laptop that wants the "
        "interactive docs sets OPENFT_API_DOCS_PUBLIC=true.",
    )
    public_base_url: str | None = Field(
        None,
        description="The URL clients reach this API at, without /v1 (https://ft.example.com, or "
        "https://example.com/openft behind a path prefix); redirects (merged-file downloads) point under it. "
        "Unset: their Location is relative (/v1/..., after the Serve route prefix), which a client resolves "
        "against the URL it called, so it works on a laptop and never names a host taken from the request.",
    )

    @field_validator("public_base_url")
    @classmethod
    def _plain_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parsed = urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
            raise ValueError("public_base_url must be an http(s) URL with a host and no query, e.g. https://ft.example.com")
        return value.rstrip("/")

    # -- Rate limits per account (its API keys together) and uploads in flight per account (serve_app/rate_limits.py) --
    rate_limit_requests_per_second: float = Field(
        50.0, ge=0, description="Token bucket on every authenticated request, per account (all its API keys "
        "together, so that more keys are not more requests), shared by all replicas through the database; "
        "0 = unlimited (no database write per request).",
    )
    rate_limit_requests_burst: int = Field(100, ge=1, description="Requests an account may make at once before the rate applies.")
    rate_limit_heavy_per_second: float = Field(
        2.0, ge=0, description="A stricter bucket, per account, on uploads (POST /v1/files) and job creates together, "
        "on top of the general one; 0 = unlimited.",
    )
    rate_limit_heavy_burst: int = Field(10, ge=1, description="Uploads and job creates an account may make at once.")
    uploads_in_flight_per_account: int = Field(
        4, ge=0, description="Uploads of one account receiving their body at once, across all replicas; a further "
        "one answers 429 rate_limit_exceeded. 0 = unlimited.",
    )
    upload_slot_lease_seconds: float = Field(
        60.0, gt=0, description="An upload renews its slot's lease every third of this while it runs: a replica that "
        "dies mid-upload holds the slot at most this long.",
    )

    # --- Serving the API (issue 12): Serve sizing, slow clients, start-up checks, shutdown ---
    api_replicas: int = Field(
        1,
        ge=1,
        description="Ray Serve replicas of the API deployment. Each is a process with its own thread pool and DB "
        "pool; add replicas for CPU (one per spare core), not for concurrency, which max_ongoing_requests gives.",
    )
    api_max_ongoing_requests: int = Field(
        128,
        ge=1,
        description="Requests one API replica takes at once (Ray Serve's max_ongoing_requests, default 5 there). "
        "Handlers are async or run on a 40-thread pool, so a replica serves far more than 5; a low cap queues "
        "list/retrieve calls in the proxy behind uploads that hold their slot for the length of the transfer.",
    )
    http_max_headers: int = Field(
        100, ge=1, description="Header fields one request may have; more are refused 431 too_many_headers before "
        "anything else (serve_app/request_head.py). The Serve proxy reads it from its own environment.",
    )
    http_max_header_field_bytes: int = Field(
        8192, ge=256, description="Longest header field (name and value), and longest request line (414 "
        "uri_too_long); a longer field is refused 431 header_too_large.",
    )
    http_max_header_bytes: int = Field(
        32768, ge=1024, description="The request line and every header field together; more is refused 431 "
        "headers_too_large, by the Serve proxy as soon as it has read that much.",
    )
    body_idle_timeout_seconds: float = Field(
        30.0, gt=0, description="A request body that sends no byte for this long is refused 408 request_timeout."
    )
    upload_min_bytes_per_second: int = Field(
        1024,
        ge=0,
        description="After body_rate_grace_seconds of waiting on the client, a request body that has averaged fewer "
        "bytes per second than this (counting only time spent waiting for it) is refused 408 request_timeout. "
        "0 turns the check off.",
    )
    body_rate_grace_seconds: float = Field(
        10.0, ge=0, description="Waiting time a request body gets before upload_min_bytes_per_second applies."
    )
    preflight_timeout_seconds: float = Field(
        10.0, gt=0, description="How long each start-up check (database, object store) may take before it fails."
    )
    shutdown_grace_seconds: float = Field(
        3.0,
        ge=0,
        description="On SIGTERM, requests in flight get this long to finish before the API replicas stop; "
        "`openft serve` exits within a few seconds more.",
    )
    # -- serving-parity check at registration (issue 13, train/parity.py) --
    parity_check: bool = Field(
        True,
        description="Before an ft: model is marked servable, generate held-out prompts through the batch engine, the "
        "merged weights and the training-time model, and register it servable only if they agree and end their turns.",
    )
    parity_prompts: int = Field(4, ge=1, description="Held-out prompts the parity check generates (fewer if the job has fewer).")
    parity_max_tokens: int = Field(
        256, ge=1, description="Most tokens a parity completion may take (each prompt: twice its row's answer, plus 16)."
    )
    parity_logit_tolerance: float = Field(
        0.05,
        ge=0,
        description="Where two paths' greedy tokens first differ, the training-time model's logit margin between the two "
        "tokens must be at most this (a float tie); above it the paths disagree and the model is not servable.",
    )
    parity_timeout_seconds: float = Field(
        900.0, gt=0, description="A parity check running longer is stopped; the model is registered not servable."
    )


    # -- batches (issue 13, h1): the batch engine --
    batch_engine: str = Field(
        "transformers", description="Batch engine: transformers (multi-LoRA on transformers + peft) | vllm (GPU nodes)."
    )
    batch_engine_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1},
        description='Ray resources of one batch engine actor, like training workers: {"GPU": 1} on GPU nodes.',
    )
    batch_engine_actors: int = Field(1, ge=1, description="Engine actors one batch runs on (each holds the base once).")
    batch_max_rows_in_flight: int = Field(
        16, ge=1, description="Rows one engine actor decodes together (and takes per call)."
    )
    # -- end batches (h1) --
    # -- online chat completions (issue 27, online/): one Serve deployment per served base --
    online_bases: list[str] | None = Field(
        None,
        description="Bases answered online (POST /v1/chat/completions), with their ft: models and checkpoints; "
        "None: every servable base of the catalog; [] turns online serving off. A base not listed answers "
        "400 model_not_available.",
    )
    online_replica_resources: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 0},
        description='Ray resources of one online replica (one copy of a base): say which nodes serve, e.g. {"GPU": 1, '
        '"online": 1} with a custom resource on the serving nodes. The job controller keeps online_max_replicas of '
        "these per served base out of what training and batches count on (jobs/scheduling.py), so serving never "
        "starves training. The default takes no CPU: on one laptop it shares the cores and reserves nothing.",
    )
    online_min_replicas: int = Field(
        0, ge=0, description="Replicas per served base when idle. 0 scales a base to zero after online_idle_seconds "
        "without requests; its next request waits for a replica to load the base (seconds on the stand-ins, tens "
        "of seconds for a 7B base on a GPU).",
    )
    online_max_replicas: int = Field(1, ge=1, description="Most replicas per served base under load.")
    online_target_ongoing_requests: float = Field(
        8.0, gt=0, description="Requests per replica Serve's autoscaler aims at: more add replicas, fewer remove them.",
    )
    online_max_ongoing_requests: int = Field(
        32, ge=1, description="Requests one replica takes at once; those past online_max_batch_rows wait in its queue.",
    )
    online_max_batch_rows: int = Field(
        16, ge=1, description="Requests one replica decodes together on one KV cache (continuous batching).",
    )
    online_stream_interval_seconds: float = Field(
        0.05, ge=0, description="A streamed answer's text after its first piece goes out at most this often, what was "
        "generated meanwhile in one chunk (each chunk costs the service CPU that decoding could use); 0 = a chunk per "
        "token.",
    )
    online_stream_chunks_per_second: float = Field(
        100.0, ge=0, description="Chunks one replica's streams send a second in all, after each one's first: with more "
        "streams open than this times online_stream_interval_seconds, each one's interval stretches to streams / this "
        "(16 streams at 100: a chunk each per 0.16 s), so chunks take a bounded share of the CPU however many clients "
        "stream; 0 = no such bound.",
    )
    online_adapters_per_replica: int = Field(
        8, ge=1, description="Adapters one replica keeps loaded; past it the least recently used one is unloaded.",
    )
    online_idle_seconds: float = Field(
        600.0, gt=0, description="Seconds without requests before a base scales down (to online_min_replicas).",
    )
    online_generations_per_account: int = Field(
        16, ge=0, description="Chat completions one account may have generating at once, across all replicas; another "
        "answers 429 rate_limit_exceeded with Retry-After. 0 = unlimited.",
    )
    rate_limit_generations_per_second: float = Field(
        10.0, ge=0, description="A bucket per account on chat completions, on top of the general one; 0 = unlimited.",
    )
    rate_limit_generations_burst: int = Field(20, ge=1, description="Chat completions an account may start at once.")
    # -- end online --
    # -- graders (issue 25): the python sandbox's limits (OpenAI's by default) and model graders --
    grader_python_wall_seconds: float = Field(120.0, gt=0, description="A python grader's run is killed past this wall time.")
    grader_python_cpu_seconds: int = Field(120, ge=1, description="CPU seconds one python grader run may use.")
    grader_python_memory_bytes: int = Field(2 * 1024**3, ge=64 * 1024**2, description="Address space of each process of a python grader run.")
    grader_python_disk_bytes: int = Field(1024**3, ge=4096, description="Size of a python grader run's scratch dir (/tmp) and of any file it writes.")
    grader_python_max_processes: int = Field(64, ge=1, description="Processes (and threads) one python grader run may hold at once.")
    grader_model_timeout_seconds: float = Field(
        600.0, gt=0, description="A model grader's generation (one Ray task per base, on batch_engine_resources) past "
        "this is stopped; its grades are 0 with the reason.",
    )
    # -- end graders --
    # -- webhooks (issue 16, webhooks/delivery.py) --
    webhook_timeout_seconds: float = Field(
        10.0, gt=0, description="One delivery attempt, and one `test` POST, all told: name lookup, connect, TLS, the "
        "request and the answer's status line and headers. Past it the attempt failed (timeout) and is retried.",
    )
    webhook_backoff_seconds: float = Field(
        30.0, gt=0, description="Wait before the second attempt; each later wait doubles, up to "
        "webhook_backoff_max_seconds, plus up to webhook_backoff_jitter of itself at random.",
    )
    webhook_backoff_max_seconds: float = Field(3600.0, gt=0, description="Longest wait between two attempts.")
    webhook_backoff_jitter: float = Field(
        0.2, ge=0, le=1, description="Random extra wait, as a fraction of the backoff (never less than the backoff).",
    )
    webhook_retry_window_seconds: float = Field(
        86400.0, gt=0, description="A delivery not accepted (2xx) this long after its event is marked failed.",
    )
    webhook_lease_seconds: float = Field(
        60.0, gt=0, description="A deliverer's lease on the deliveries it claimed; another deliverer takes a "
        "delivery only after it lapses. Keep it well above webhook_timeout_seconds.",
    )
    webhook_poll_seconds: float = Field(1.0, gt=0, description="How often the controller's deliverer looks for due deliveries.")
    webhook_concurrency: int = Field(
        16, ge=1, description="Deliveries one deliverer POSTs at once; it claims the next due one as soon as one ends.",
    )
    webhook_endpoint_concurrency: int = Field(
        2, ge=1, description="Deliveries one deliverer POSTs at once to one endpoint (counted by its URL's scheme, host and port), so that a slow receiver "
        "holds at most this many of the webhook_concurrency slots.",
    )
    webhook_allowed_networks: list[IPvAnyNetwork] = Field(
        default_factory=list, description="Networks webhooks may reach although the address rule refuses them "
        '(loopback, private, link-local, multicast, cloud metadata: webhooks/targets.py), e.g. ["10.20.0.0/16"] '
        "for a receiver inside the operator's network. Empty: none.",
    )
    webhook_endpoints_per_account: int = Field(
        20, ge=0, description="Webhook endpoints one account may register; another create answers 429 limit_exceeded.",
    )
    webhook_log_retention_days: float = Field(
        30, gt=0, description="The reaper deletes a delivery and its attempts this long after it was delivered or failed.",
    )
    # -- end webhooks --

    # -- experiment tracking (issue 15, integrations/): where a job's `integrations` log --
    wandb_mode: Literal["off", "online", "offline"] = Field(
        "off",
        description="Weights & Biases for jobs that ask for it: off (a wandb integration is refused at create), "
        "online (to wandb_base_url with wandb_api_key) or offline (run files under wandb_dir, for `wandb sync`).",
    )
    wandb_base_url: str | None = Field(None, description="The W&B server (a self-hosted one); unset: wandb's default.")
    wandb_api_key: SecretStr | None = Field(None, description="The W&B API key every job logs with (online mode).")
    wandb_dir: Path | None = Field(None, description="Where wandb writes its run files; default <data dir>/wandb.")
    mlflow_tracking_uri: str | None = Field(
        None, description="An MLflow tracking server (http(s)://host:port) for jobs with an mlflow integration; unset: "
        "an mlflow integration is refused at create.",
    )
    tracking_poll_seconds: float = Field(
        2.0, gt=0, description="How often a job's tracking forwarder reads its new metrics events from the database."
    )
    tracking_timeout_seconds: float = Field(
        90.0, gt=0, description="How long one call to a tracking server may take: wandb's start (90 s is wandb's own "
        "default; it starts a service process first), an MLflow request.",
    )
    # -- end experiment tracking --

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, value: Path) -> Path:
        # Settings travel to Ray workers, whose working directory is not the caller's.
        return value.expanduser().resolve()

    def resolved_wandb_dir(self) -> Path:
        return self.wandb_dir or self.data_dir / "wandb"

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir.resolve() / 'openft.db'}"

    def resolved_storage_url(self) -> str:
        return self.storage_url or f"file://{self.data_dir.resolve() / 'objects'}"

    def resolved_signing_secret(self) -> bytes:
        """`signing_secret`, else the data dir's `signing_secret` file, created (mode 0600) on first use."""
        if self.signing_secret:
            return self.signing_secret.encode()
        path = self.data_dir.resolve() / "signing_secret"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".signing_secret.{secrets.token_hex(8)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # atomic: concurrent replicas all end up reading the first key written
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        return path.read_bytes().strip()

    @property
    def model_cache_dir(self) -> Path:
        """Hub downloads and generated stand-in bases."""
        return self.data_dir.resolve() / "models"

    @property
    def ray_temp_dir(self) -> Path:
        return self.data_dir.resolve() / "ray"
