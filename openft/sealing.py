"""The one key derivation for what the service encrypts with `Settings.signing_secret`: each use
(download tokens, webhook signing secrets at rest) derives its own AES-256-GCM key under a label of
its own (HKDF), so that the secret itself keys nothing directly and no two uses share a key."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE_BYTES = 12


def aead(secret: bytes, label: bytes) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(secret)
    return AESGCM(key)
