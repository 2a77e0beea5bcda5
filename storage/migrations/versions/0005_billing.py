"""Billing: the credit ledger, per-account limits, the charge on a job and the run-copies reaper mark.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("job_id", sa.String(48), nullable=True),
        sa.Column("idempotency_key", sa.String(160), nullable=True, unique=True),
        sa.Column("note", sa.String(200), nullable=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_ledger_account", "ledger", ["account_id", "seq"])
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_table(
        "account_limits",
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("open_jobs_set", sa.Boolean, nullable=False),
        sa.Column("usd_per_day_cents", sa.BigInteger, nullable=True),
        sa.Column("models", sa.Integer, nullable=True),
    )
    op.add_column("jobs", sa.Column("charge", sa.JSON, nullable=True))
    op.add_column("jobs", sa.Column("copies_deleted_at", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("copies_deleted_at")
        batch.drop_column("charge")
    op.drop_table("account_limits")
    op.drop_table("ledger")
