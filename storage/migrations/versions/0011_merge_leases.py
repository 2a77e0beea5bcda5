"""Leases for merges, like the other kinds of background work (storage/leases.py), and a distill
shortcut job's own attempts count (its distill leases are not run attempts).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("merges") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(64), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.BigInteger, nullable=True))
    op.create_index("ix_merges_lease_owner", "merges", ["lease_owner"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("distill_attempts", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("distill_attempts")
    op.drop_index("ix_merges_lease_owner", "merges")
    with op.batch_alter_table("merges") as batch:
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
