"""The reaper's mark on tokenized shards it is deleting, which a starting job waits out.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokenized_reaps",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("started_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tokenized_reaps")
