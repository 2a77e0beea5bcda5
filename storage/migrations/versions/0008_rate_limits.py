"""Per-account token buckets and upload-slot leases, shared by every API replica.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_buckets",
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("bucket", sa.String(16), primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("allowed", sa.Boolean, nullable=False),
    )
    op.create_table(
        "upload_slots",
        sa.Column("holder", sa.String(32), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_upload_slots_account_id", "upload_slots", ["account_id"])


def downgrade() -> None:
    op.drop_index("ix_upload_slots_account_id", "upload_slots")
    op.drop_table("upload_slots")
    op.drop_table("rate_buckets")
