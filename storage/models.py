"""ORM models of the metadata database. Every row that a user owns carries `account_id`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    org_id: Mapped[str] = mapped_column(String(20), unique=True)
    # Retired by migration 0012, which moved each account's key to `api_keys` (several per account).
    # SQLite cannot drop a UNIQUE column of a table that others reference inside the migration's
    # transaction (the rebuild's DROP TABLE fails their foreign keys), so the columns stay and hold a
    # placeholder (`retired:` and the account id), never a key's hash.
    retired_key_sha256: Mapped[str] = mapped_column("key_sha256", String(64), unique=True)
    retired_key_hint: Mapped[str] = mapped_column("key_hint", String(16))
    open_jobs_limit: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)


class ApiKey(Base):
    """One API key of an account (issue 24): the account may hold several, each with a name and an
    optional expiry; a revoked one keeps its row (for the record) and never authenticates again.

    Only the key's SHA-256 is stored: keys are 256-bit random, so a fast hash is enough to make a
    leaked table useless, and the lookup stays an index seek; the final comparison is constant-time."""

    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_account_created", "account_id", "created_ns", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(256))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    # What lists show of it: the prefix and the last 4 characters.
    redacted_value: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    # Written at most once a minute per key (storage/api_keys.py): a write per request would cost
    # every request a row lock.
    last_used_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_account_created", "account_id", "created_ns", "id"),
        Index("ix_files_expires", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # Nanoseconds at creation: orders lists stably where many objects share one created_at second.
    created_ns: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64))
    object_key: Mapped[str] = mapped_column(String(512))
    # Validation results (fine-tune files): see pipelines/validate.py FileStats.
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    derived_from: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_account_created", "account_id", "created_ns", "id"),
        Index("ix_jobs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    model: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(24))
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    estimated_finish: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    training_file: Mapped[str] = mapped_column(String(40))
    validation_file: Mapped[str | None] = mapped_column(String(40), nullable=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    # The normalized create request (jobs/spec.py JobSpec) the trainer reads.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    job_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    user_provided_suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    quote: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(160), nullable=True)
    fine_tuned_adapter: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    result_files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Requests the trainer acts on at its next step; the status changes once it has.
    control: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # The status a paused job had: it resumes there, and holds the account's slot unless it was waiting.
    paused_from: Mapped[str | None] = mapped_column(String(24), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Distill leases taken on a distill-shortcut job (storage/leases.py: a distill's attempts, not a run's).
    distill_attempts: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    # What the job was charged once it ended under billing (storage/billing.py settle); shown as gridline.charge.
    charge: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # When the reaper deleted the run's copies (tokenized shards it alone used, checkpoints).
    copies_deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The run (or, while the job distills, the distiller) driving the job (storage/leases.py): set when
    # it starts, renewed by its heartbeat, cleared when it stops. A lease that expires is lost work.
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The last time the run wrote an event or metrics: the stall watchdog reads it.
    progress_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When the job entered its current wait (validating_files or queued): the 24-hour wait counts from here.
    waiting_since: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Start of the current run, and the active seconds of the job's earlier runs: the time limit covers both.
    run_started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # The Ray placement group of the run's Train workers (hex id): a run stopped from outside, or lost
    # with its controller, leaves it reserved, so whoever stops or reconciles the run removes it.
    run_placement_group: Mapped[str | None] = mapped_column(String(64), nullable=True)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_seq", "job_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[int] = mapped_column(BigInteger)
    level: Mapped[str] = mapped_column(String(8))
    message: Mapped[str] = mapped_column(String(2000))
    type: Mapped[str] = mapped_column(String(8))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class FineTunedModel(Base):
    """An `ft:` adapter registered by a succeeded job (servable or download-only)."""

    __tablename__ = "ft_models"
    __table_args__ = (Index("ix_ft_models_account", "account_id", "created_ns"),)

    id: Mapped[str] = mapped_column(String(160), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    job_id: Mapped[str] = mapped_column(String(48), unique=True)
    base: Mapped[str] = mapped_column(String(64))
    servable: Mapped[bool] = mapped_column()
    reason: Mapped[str | None] = mapped_column(String(300), nullable=True)
    adapter_prefix: Mapped[str] = mapped_column(String(512))
    # {"adapter_model.safetensors": {"sha256": ..., "bytes": ...}, "adapter_config.json": {...}}
    files: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # A storage delete that failed is recorded here; the files stay unreachable through the API.
    delete_error: Mapped[str | None] = mapped_column(String(300), nullable=True)


class Merge(Base):
    """One accepted merge of an `ft:` model into its base, and the export it stored.

    The API shows an account's newest row per model that is not deleted; older rows stay as the
    record behind the daily limit.
    """

    __tablename__ = "merges"
    __table_args__ = (
        Index("ix_merges_account_model", "account_id", "model", "created_ns"),
        Index("ix_merges_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    model: Mapped[str] = mapped_column(String(160))
    base: Mapped[str] = mapped_column(String(64))
    # queued | running | succeeded | failed | expired
    status: Mapped[str] = mapped_column(String(16))
    export_prefix: Mapped[str] = mapped_column(String(512))
    # The adapter's digests when the merge was requested: a merge of changed files fails.
    adapter_sha256: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Every stored file once succeeded: [{path, bytes, sha256, modified}].
    files: Mapped[list[Any]] = mapped_column(JSON, default=list)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # {code, message}: the failure, or while queued again the last attempt's timeout.
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # A DELETE that arrived while the merge ran: the worker deletes what it wrote and fails it.
    delete_requested: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When the export's objects were deleted; null on a deleted or expired export means a storage
    # delete is still owed (the worker retries it).
    purged_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The worker running the merge (storage/leases.py): set at claim, renewed, cleared at its end.
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class LedgerEntry(Base):
    """One append-only credit movement, in integer cents. `amount_cents` is the entry's effect on
    the available credit: deposit and refund +, charge -, hold - (reserved), release + (unreserved).
    The balance is the sum of deposits, refunds and charges; available is the sum of every entry."""

    __tablename__ = "ledger"
    __table_args__ = (Index("ix_ledger_account", "account_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    # A plain id, not a foreign key: the ledger outlives jobs deleted after their retention.
    job_id: Mapped[str | None] = mapped_column(String(48), nullable=True, index=True)
    # `hold:{job}`, `release:{job}`, `charge:{job}`: a replayed step cannot write its entry twice.
    idempotency_key: Mapped[str | None] = mapped_column(String(160), unique=True, nullable=True)
    note: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class AccountLimits(Base):
    """Limits an operator set for one account; a null column means the settings' default."""

    __tablename__ = "account_limits"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    # Set explicitly (CLI --open-jobs, admin API): a first deposit does not raise accounts.open_jobs_limit.
    open_jobs_set: Mapped[bool] = mapped_column(default=False)
    usd_per_day_cents: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    models: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TokenizedReap(Base):
    """The reaper is deleting the tokenized shards of files with these bytes (`storage/tokenized_reaps.py`)."""

    __tablename__ = "tokenized_reaps"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    started_at: Mapped[int] = mapped_column(BigInteger)


class SchedulerLock(Base):
    """One row: a scheduling pass holds its lock, so two controllers on one database never start
    runs past the concurrency cap together. Lock order: this row, then an account, then its jobs."""

    __tablename__ = "scheduler_lock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)


class RateBucket(Base):
    """One token bucket of one account (`storage/rate_limits.py`): every API replica updates the
    same row, so together they allow the configured rate, not one rate each."""

    __tablename__ = "rate_buckets"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    bucket: Mapped[str] = mapped_column(String(16), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    # Seconds since the epoch on the database's clock (replicas' clocks may disagree).
    updated_at: Mapped[float] = mapped_column(Float)
    # Whether the last request took a token: the upsert's RETURNING sees only the new row.
    allowed: Mapped[bool] = mapped_column()


class UploadSlot(Base):
    """An upload in flight, held by a lease its replica renews; a crashed replica's lease lapses."""

    __tablename__ = "upload_slots"

    holder: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    expires_at: Mapped[float] = mapped_column(Float)
    # What the slot is for: "upload" (a body being received) or "generation" (an online chat
    # completion being generated, issue 27); each kind has its own cap per account.
    kind: Mapped[str] = mapped_column(String(16), server_default="upload")


class OnlineUsage(Base):
    """An account's online chat completion tokens on one base, and what they have cost: the cost is
    accrued in micro-cents per request and charged to the ledger a whole cent at a time (issue 27)."""

    __tablename__ = "online_usage"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    base: Mapped[str] = mapped_column(String(64), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    accrued_microcents: Mapped[int] = mapped_column(BigInteger, default=0)
    charged_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[int] = mapped_column(BigInteger)


# -- batches (issue 13) --
class Batch(Base):
    """One batch of chat completions (OpenAI's Batch API) over a base and its ft: models.

    Its status changes only in batches/transitions.py. `plan` is what the create-time scan found
    (batches/scan.py): the base, the runnable models, the refused ones and the line count; the
    controller runs the batch from it."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_account_created", "account_id", "created_ns", "id"),
        Index("ix_batches_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    # validating | failed | in_progress | finalizing | completed | expired | cancelling | cancelled
    status: Mapped[str] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(8))
    input_file_id: Mapped[str] = mapped_column(String(40), index=True)
    model: Mapped[str] = mapped_column(String(64))  # the base every line runs on
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    in_progress_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finalizing_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    failed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expired_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelling_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # OpenAI's `errors.data`: [{code, message, param, line}] (a failed batch's reasons).
    errors: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    request_counts: Mapped[dict[str, Any]] = mapped_column(JSON)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Billing on: the quote held at start (batches/billing.py) and what the batch was charged.
    quote: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    charge: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The controller driving the batch (like Job's run lease): set at claim, renewed, cleared at the end.
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the staged adapter copies (storage/keys.py batch_stage) were deleted after the end.
    stage_deleted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger)


# -- webhooks (issue 16) --
class WebhookEndpoint(Base):
    """A URL an account registered for some event types (OpenAI's webhook endpoint). `secret` is
    stored sealed (webhooks/secrets.py), not hashed: every delivery is signed with it (HMAC). After
    a rotation that keeps the old one, deliveries carry a second signature with `previous_secret`
    until `previous_secret_until`."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_account_created", "account_id", "created_ns", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(160))
    previous_secret: Mapped[str | None] = mapped_column(String(160), nullable=True)
    previous_secret_until: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class WebhookDelivery(Base):
    """One event owed to one endpoint: the outbox row, written in the transaction that ended the job
    or batch (webhooks/outbox.py), and claimed under a lease by a deliverer (webhooks/delivery.py).
    `payload` is the exact body, so every retry sends the same bytes under the same webhook-id
    (`event_id`). Times are float seconds: backoff starts below a second in tests."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "created_ns", "id"),
        UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_endpoint_event"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    account_id: Mapped[str] = mapped_column(String(40))
    event_id: Mapped[str] = mapped_column(String(40))
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(Text)
    # pending | delivered | failed
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    next_attempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(32), nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class WebhookAttempt(Base):
    """One POST of a delivery, for the owner's delivery log."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (UniqueConstraint("delivery_id", "attempt", name="uq_webhook_attempts_delivery_attempt"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # timeout | connection_error | http_status (status_code says which) | None when delivered
    error: Mapped[str | None] = mapped_column(String(32), nullable=True)
    next_attempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)


# -- evals (issue 25) --
class Eval(Base):
    """An eval (OpenAI's Evals API): its items' schema and its testing criteria, graders that
    graders/validate.py accepted, stored as the caller sent them. Runs (a later part) reference it
    by id and read the criteria as they were when the run started (a run copies them)."""

    __tablename__ = "evals"
    __table_args__ = (
        Index("ix_evals_account_created", "account_id", "created_ns", "id"),
        Index("ix_evals_account_updated", "account_id", "updated_ns", "id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(256))
    # {"type": "custom", "item_schema": {...}, "include_sample_schema": bool}
    data_source_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    testing_criteria: Mapped[list[Any]] = mapped_column(JSON)
    eval_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    updated_ns: Mapped[int] = mapped_column(BigInteger)


class EvalRun(Base):
    """One run of an eval (OpenAI's Evals API runs): its data source, the criteria copied from the
    eval when it was created (an update or a delete of the eval never changes a run), and what the
    run found. Its status changes only in evals/transitions.py; its lease is storage/leases.py's
    (kind `EVAL_RUN`). The items it grades are an object under storage/keys.py `eval_run`."""

    __tablename__ = "eval_runs"
    __table_args__ = (
        Index("ix_eval_runs_eval_created", "eval_id", "created_ns", "id"),
        Index("ix_eval_runs_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    eval_id: Mapped[str] = mapped_column(String(40), index=True)
    name: Mapped[str] = mapped_column(String(256))
    # queued | in_progress | completed | failed | canceled (OpenAI's run statuses)
    status: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(128))  # the model sampled; "" for a jsonl run
    data_source: Mapped[dict[str, Any]] = mapped_column(JSON)  # as the caller sent it
    criteria: Mapped[list[Any]] = mapped_column(JSON)  # the eval's testing_criteria when the run was created
    # evals/plan.py `RunPlan.record()`: items, base, model kind, adapter prefix, token bound, templates.
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    run_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    result_counts: Mapped[dict[str, Any]] = mapped_column(JSON)
    per_criteria: Mapped[list[Any]] = mapped_column(JSON)
    per_model_usage: Mapped[list[Any]] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # {code, message}
    quote: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # billing: batches/billing.py
    charge: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    lease_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int] = mapped_column(BigInteger)  # with its account's files (retention)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class EvalOutputItem(Base):
    """One graded item of a run: the item, its sample and every criterion's grade with its reason."""

    __tablename__ = "eval_output_items"
    __table_args__ = (Index("ix_eval_output_items_run_created", "run_id", "created_ns", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    run_id: Mapped[str] = mapped_column(String(40))
    eval_id: Mapped[str] = mapped_column(String(40))
    item_index: Mapped[int] = mapped_column(Integer)
    item: Mapped[dict[str, Any]] = mapped_column(JSON)
    sample: Mapped[dict[str, Any]] = mapped_column(JSON)
    results: Mapped[list[Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(8))  # pass | fail | error (the sample could not be made)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
