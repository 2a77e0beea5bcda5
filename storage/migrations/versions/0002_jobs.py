"""Fine-tuning jobs and their events.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False, index=True),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=True),
        sa.Column("finished_at", sa.BigInteger, nullable=True),
        sa.Column("estimated_finish", sa.BigInteger, nullable=True),
        sa.Column("training_file", sa.String(40), nullable=False),
        sa.Column("validation_file", sa.String(40), nullable=True),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("user_provided_suffix", sa.String(64), nullable=True),
        sa.Column("quote", sa.JSON, nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("fine_tuned_model", sa.String(160), nullable=True),
        sa.Column("fine_tuned_adapter", sa.JSON, nullable=True),
        sa.Column("trained_tokens", sa.BigInteger, nullable=True),
        sa.Column("result_files", sa.JSON, nullable=False),
        sa.Column("control", sa.String(16), nullable=True),
        sa.Column("paused_from", sa.String(24), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_jobs_account_created", "jobs", ["account_id", "created_ns", "id"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "job_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("job_id", sa.String(48), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("message", sa.String(2000), nullable=False),
        sa.Column("type", sa.String(8), nullable=False),
        sa.Column("data", sa.JSON, nullable=True),
    )
    op.create_index("ix_job_events_job_seq", "job_events", ["job_id", "seq"])


def downgrade() -> None:
    op.drop_table("job_events")
    op.drop_table("jobs")
