"""Evals: an account's eval definitions (item schema, testing criteria).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "evals",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("data_source_config", sa.JSON, nullable=False),
        sa.Column("testing_criteria", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("updated_ns", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_evals_account_created", "evals", ["account_id", "created_ns", "id"])
    op.create_index("ix_evals_account_updated", "evals", ["account_id", "updated_ns", "id"])


def downgrade() -> None:
    op.drop_index("ix_evals_account_updated", "evals")
    op.drop_index("ix_evals_account_created", "evals")
    op.drop_table("evals")
