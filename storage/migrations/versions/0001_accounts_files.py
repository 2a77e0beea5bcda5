"""Accounts and files.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("org_id", sa.String(20), nullable=False, unique=True),
        sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("key_hint", sa.String(16), nullable=False),
        sa.Column("open_jobs_limit", sa.Integer, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False, index=True),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("object_key", sa.String(512), nullable=False),
        sa.Column("stats", sa.JSON, nullable=False),
        sa.Column("derived_from", sa.JSON, nullable=True),
        sa.Column("deleted_at", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_files_account_created", "files", ["account_id", "created_ns", "id"])
    op.create_index("ix_files_expires", "files", ["expires_at"])


def downgrade() -> None:
    op.drop_table("files")
    op.drop_table("accounts")
