"""API keys: several per account, each with a name, last use, expiry and revocation; the key each
account had moves here (it keeps working), and `accounts.key_sha256` keeps a placeholder. Webhook
signing secrets are stored sealed from now on: their columns widen (PostgreSQL; SQLite does not
enforce a length), and each API replica's start seals the ones stored before (webhooks/secrets.py).

Revision ID: 0012
Revises: 0011
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

KEY_PREFIX = "sk-openft-"  # storage/accounts.py's, as of this revision


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.String(40), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("redacted_value", sa.String(32), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("last_used_at", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.BigInteger, nullable=True),
        sa.Column("revoked_at", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_api_keys_account_created", "api_keys", ["account_id", "created_ns", "id"])
    conn = op.get_bind()
    accounts = conn.execute(sa.text("SELECT id, key_sha256, key_hint, created_at FROM accounts")).all()
    for account_id, sha256, hint, created_at in accounts:
        conn.execute(sa.text(
            "INSERT INTO api_keys (id, account_id, name, sha256, redacted_value, created_at, created_ns) "
            "VALUES (:id, :account_id, 'default', :sha256, :redacted, :created_at, :created_ns)"),
            {"id": "key_" + secrets.token_hex(12), "account_id": account_id, "sha256": sha256,
             "redacted": f"{KEY_PREFIX}...{hint}", "created_at": created_at, "created_ns": created_at * 10**9})
    conn.execute(sa.text("UPDATE accounts SET key_sha256 = 'retired:' || id, key_hint = ''"))
    if conn.dialect.name == "postgresql":
        for column in ("secret", "previous_secret"):
            op.alter_column("webhook_endpoints", column, type_=sa.String(160))


def downgrade() -> None:
    conn = op.get_bind()
    # Back to one key per account: its oldest key that still works (an account with none keeps
    # the placeholder, which no key hashes to).
    rows = conn.execute(sa.text(
        "SELECT account_id, sha256, redacted_value FROM api_keys WHERE revoked_at IS NULL "
        "ORDER BY created_ns DESC")).all()
    for account_id, sha256, redacted in rows:  # newest first: the oldest is written last
        conn.execute(sa.text("UPDATE accounts SET key_sha256 = :sha256, key_hint = :hint WHERE id = :id"),
                     {"sha256": sha256, "hint": redacted[-4:], "id": account_id})
    op.drop_index("ix_api_keys_account_created", "api_keys")
    op.drop_table("api_keys")
