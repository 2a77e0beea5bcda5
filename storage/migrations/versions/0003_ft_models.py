"""Registered fine-tuned models (adapters).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ft_models",
        sa.Column("id", sa.String(160), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("job_id", sa.String(48), nullable=False, unique=True),
        sa.Column("base", sa.String(64), nullable=False),
        sa.Column("servable", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String(300), nullable=True),
        sa.Column("adapter_prefix", sa.String(512), nullable=False),
        sa.Column("files", sa.JSON, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("deleted_at", sa.BigInteger, nullable=True),
        sa.Column("delete_error", sa.String(300), nullable=True),
    )
    op.create_index("ix_ft_models_account", "ft_models", ["account_id", "created_ns"])


def downgrade() -> None:
    op.drop_table("ft_models")
