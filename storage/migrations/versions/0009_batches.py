"""Batches (OpenAI's Batch API over a base and its ft: models).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TIMESTAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
              "cancelled_at", "lease_expires_at", "stage_deleted_at")


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(8), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("plan", sa.JSON, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        *(sa.Column(name, sa.BigInteger, nullable=True) for name in TIMESTAMPS),
        sa.Column("output_file_id", sa.String(40), nullable=True),
        sa.Column("error_file_id", sa.String(40), nullable=True),
        sa.Column("errors", sa.JSON, nullable=True),
        sa.Column("request_counts", sa.JSON, nullable=False),
        sa.Column("usage", sa.JSON, nullable=True),
        sa.Column("quote", sa.JSON, nullable=True),
        sa.Column("charge", sa.JSON, nullable=True),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_batches_account_created", "batches", ["account_id", "created_ns", "id"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_input_file_id", "batches", ["input_file_id"])
    op.create_index("ix_batches_output_file_id", "batches", ["output_file_id"])
    op.create_index("ix_batches_lease_owner", "batches", ["lease_owner"])


def downgrade() -> None:
    for name in ("ix_batches_lease_owner", "ix_batches_output_file_id", "ix_batches_input_file_id",
                 "ix_batches_status", "ix_batches_account_created"):
        op.drop_index(name, "batches")
    op.drop_table("batches")
