"""Webhook signing secrets at rest: encrypted (AES-256-GCM) under a key derived from
`Settings.signing_secret` (openft/sealing.py), so that a copy of the database, a backup or a
replica's dump does not hand out the secrets that let anyone forge this service's deliveries.
A secret cannot be stored hashed: every delivery is signed with it (HMAC).

A stored value is `enc1:` and base64url(nonce ‖ ciphertext ‖ tag); a value stored before 0012
(`whsec_...`) still reads, and each API replica's start encrypts those (`seal_stored`)."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag

from openft.sealing import NONCE_BYTES, aead
from openft.settings import Settings
from storage import webhooks as repo
from storage.db import Database
from webhooks.signing import SECRET_PREFIX

PREFIX = "enc1:"
_LABEL = b"openft webhook signing secret v1"


class SecretUnreadable(Exception):
    """A stored secret that this key did not seal (the signing secret changed since)."""


class SecretBox:
    """Seals and opens the secrets of one deployment's key."""

    def __init__(self, settings: Settings):
        self._aead = aead(settings.resolved_signing_secret(), _LABEL)

    def seal(self, secret: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, secret.encode(), _LABEL)
        return PREFIX + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, stored: str) -> str:
        if stored.startswith(SECRET_PREFIX):  # stored before 0012, not yet sealed
            return stored
        raw = base64.urlsafe_b64decode(stored.removeprefix(PREFIX) + "==")
        try:
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _LABEL).decode()
        except (InvalidTag, ValueError):
            raise SecretUnreadable("a webhook signing secret does not open with this deployment's signing_secret") from None

    def open_all(self, stored: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.open(s) for s in stored)


def seal_stored(db: Database, box: SecretBox) -> int:
    """Seal the secrets stored before 0012; returns how many endpoints changed. Two replicas doing it
    at once both write a sealing of the same secret: either opens."""
    with db.session() as session:
        rows = repo.endpoints_with_plain_secrets(session)
        for row in rows:
            row.secret = box.seal(box.open(row.secret))
            if row.previous_secret is not None:
                row.previous_secret = box.seal(box.open(row.previous_secret))
        return len(rows)
