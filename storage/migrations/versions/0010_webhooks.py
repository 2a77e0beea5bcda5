"""Webhooks: the endpoints accounts register, the outbox of deliveries, and each delivery's attempts.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("event_types", sa.JSON, nullable=False),
        sa.Column("secret", sa.String(80), nullable=False),
        sa.Column("previous_secret", sa.String(80), nullable=True),
        sa.Column("previous_secret_until", sa.BigInteger, nullable=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_webhook_endpoints_account_created", "webhook_endpoints", ["account_id", "created_ns", "id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("endpoint_id", sa.String(40), sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("account_id", sa.String(40), nullable=False),
        sa.Column("event_id", sa.String(40), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", sa.Float, nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("last_error", sa.String(32), nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_endpoint_event"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "created_ns", "id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(40), sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("error", sa.String(32), nullable=True),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.UniqueConstraint("delivery_id", "attempt", name="uq_webhook_attempts_delivery_attempt"),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    for name in ("ix_webhook_deliveries_endpoint", "ix_webhook_deliveries_due"):
        op.drop_index(name, "webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_endpoints_account_created", "webhook_endpoints")
    op.drop_table("webhook_endpoints")
