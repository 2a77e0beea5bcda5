"""Merged-weights exports: one row per accepted merge request.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "merges",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("model", sa.String(160), nullable=False),
        sa.Column("base", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("export_prefix", sa.String(512), nullable=False),
        sa.Column("adapter_sha256", sa.JSON, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("files", sa.JSON, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("delete_requested", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=True),
        sa.Column("finished_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("deleted_at", sa.BigInteger, nullable=True),
        sa.Column("purged_at", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_merges_account_model", "merges", ["account_id", "model", "created_ns"])
    op.create_index("ix_merges_status", "merges", ["status"])


def downgrade() -> None:
    op.drop_table("merges")
