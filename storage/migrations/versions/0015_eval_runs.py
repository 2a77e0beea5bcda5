"""Eval runs and their output items (issue 25, part 2).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("eval_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("data_source", sa.JSON, nullable=False),
        sa.Column("criteria", sa.JSON, nullable=False),
        sa.Column("plan", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("result_counts", sa.JSON, nullable=False),
        sa.Column("per_criteria", sa.JSON, nullable=False),
        sa.Column("per_model_usage", sa.JSON, nullable=False),
        sa.Column("error", sa.JSON, nullable=True),
        sa.Column("quote", sa.JSON, nullable=True),
        sa.Column("charge", sa.JSON, nullable=True),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", sa.BigInteger, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=True),
        sa.Column("ended_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_eval_runs_eval_created", "eval_runs", ["eval_id", "created_ns", "id"])
    op.create_index("ix_eval_runs_status", "eval_runs", ["status"])
    op.create_index("ix_eval_runs_eval_id", "eval_runs", ["eval_id"])
    op.create_index("ix_eval_runs_lease_owner", "eval_runs", ["lease_owner"])
    op.create_table(
        "eval_output_items",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("eval_id", sa.String(40), nullable=False),
        sa.Column("item_index", sa.Integer, nullable=False),
        sa.Column("item", sa.JSON, nullable=False),
        sa.Column("sample", sa.JSON, nullable=False),
        sa.Column("results", sa.JSON, nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_eval_output_items_run_created", "eval_output_items", ["run_id", "created_ns", "id"])


def downgrade() -> None:
    op.drop_index("ix_eval_output_items_run_created", "eval_output_items")
    op.drop_table("eval_output_items")
    for name in ("ix_eval_runs_lease_owner", "ix_eval_runs_eval_id", "ix_eval_runs_status", "ix_eval_runs_eval_created"):
        op.drop_index(name, "eval_runs")
    op.drop_table("eval_runs")
