"""Run leases, the wait clock and active run time on jobs; the scheduler's lock row.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (
    ("lease_owner", sa.String(64)),
    ("lease_expires_at", sa.BigInteger),
    ("progress_at", sa.BigInteger),
    ("waiting_since", sa.BigInteger),
    ("run_started_at", sa.BigInteger),
    ("run_placement_group", sa.String(64)),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
        batch.add_column(sa.Column("run_seconds", sa.Float, nullable=False, server_default="0"))
    op.create_index("ix_jobs_lease_owner", "jobs", ["lease_owner"])
    table = op.create_table("scheduler_lock", sa.Column("id", sa.Integer, primary_key=True))
    op.bulk_insert(table, [{"id": 1}])


def downgrade() -> None:
    op.drop_table("scheduler_lock")
    op.drop_index("ix_jobs_lease_owner", "jobs")
    with op.batch_alter_table("jobs") as batch:
        for name, _ in (*COLUMNS, ("run_seconds", None)):
            batch.drop_column(name)
