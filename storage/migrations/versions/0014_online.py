"""Online chat completions: generation slots beside upload slots, and each account's online usage per base.

Revision ID: 0014
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("upload_slots") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="upload"))
    op.create_table(
        "online_usage",
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("base", sa.String(64), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("accrued_microcents", sa.BigInteger, nullable=False),
        sa.Column("charged_cents", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("online_usage")
    with op.batch_alter_table("upload_slots") as batch:
        batch.drop_column("kind")
