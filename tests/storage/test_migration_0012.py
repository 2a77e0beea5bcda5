"""Migration 0012 on a database that holds data (SQLite and PostgreSQL): the key an account had
before keeps working, and becomes its `default` key with the hint it had; no key's hash is left
in `accounts`; a webhook secret stored as is before still signs, and the first start of the app
seals it; a downgrade gives each account a working key back."""

from __future__ import annotations

import hashlib
import time

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from openft.settings import Settings
from serve_app.services.api_keys import authenticate
from storage.db import MIGRATIONS_DIR, Database
from storage.models import Account, ApiKey, WebhookEndpoint
from webhooks import signing
from webhooks.secrets import PREFIX, SecretBox, seal_stored

OLD_KEY = "sk-openft-" + "k" * 43


def _migrate(url: str, revision: str, *, down: bool = False) -> None:
    engine = Database(url, migrate=False).engine
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    return request.getfixturevalue("fresh_pg_url") if request.param == "postgres" else f"sqlite:///{tmp_path}/o.db"


def test_keys_and_webhook_secrets_stored_before_0012_keep_working(url, tmp_path):
    _migrate(url, "0010")
    secret = signing.new_secret()
    now = int(time.time())
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO accounts (id, name, org_id, key_sha256, key_hint, open_jobs_limit, "
                             "created_at) VALUES ('acct-old', 'old', 'org-old', :sha, :hint, 1, :now)"),
                     {"sha": hashlib.sha256(OLD_KEY.encode()).hexdigest(), "hint": OLD_KEY[-4:], "now": now})
        conn.execute(sa.text("INSERT INTO webhook_endpoints (id, account_id, name, url, event_types, secret, "
                             "created_at, created_ns, updated_at) VALUES ('wh_old', 'acct-old', 'n', "
                             "'https://example.com/h', '[\"batch.completed\"]', :secret, :now, 1, :now)"),
                     {"secret": secret, "now": now})
    engine.dispose()

    db = Database(url)  # migrates to the newest revision
    with db.session() as session:
        assert authenticate(session, OLD_KEY, now).id == "acct-old"
        [row] = session.scalars(sa.select(ApiKey)).all()
        assert (row.name, row.redacted_value, row.created_at) == ("default", "sk-openft-..." + OLD_KEY[-4:], now)
        assert session.get(Account, "acct-old").retired_key_sha256 == "retired:acct-old"  # no hash left there
    settings = Settings(data_dir=tmp_path / "d", database_url=url)
    box = SecretBox(settings)
    assert seal_stored(db, box) == 1 and seal_stored(db, box) == 0
    with db.session() as session:
        stored = session.get(WebhookEndpoint, "wh_old").secret
    assert stored.startswith(PREFIX) and secret not in stored and box.open(stored) == secret
    db.dispose()

    _migrate(url, "0010", down=True)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT key_sha256 FROM accounts")).scalar() == hashlib.sha256(OLD_KEY.encode()).hexdigest()
    engine.dispose()
