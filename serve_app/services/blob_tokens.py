"""The tokens of the local backend's download URLs (`/v1/gridline/blobs/{token}`): opaque to
whoever holds them.

A token is `base64url(nonce ‖ AES-256-GCM(payload))`, the payload being the object key, its
SHA-256, size, download name and expiry. Encryption keeps the account id and object key out of
URLs (which end up in logs, proxies and shell history); the GCM tag makes any change to a byte, a
truncation or a splice of two tokens fail to open, exactly like a bad HMAC did before. The AES key
is derived from `Settings.signing_secret` under a label of its own (openft/sealing.py), so a future
token format can take a new label.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass

import orjson
from cryptography.exceptions import InvalidTag

from openft.sealing import NONCE_BYTES as _NONCE_BYTES
from openft.sealing import aead

_LABEL = b"openft blob token v1"
# A token of a long object key is ~400 characters; anything far longer is not one of ours and is
# refused before it is decoded.
MAX_TOKEN_CHARS = 2048
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Blob:
    """What a download URL grants: one stored object, until `expires` (unix seconds)."""

    key: str
    sha256: str
    size: int
    name: str
    expires: int


def seal(secret: bytes, blob: Blob) -> str:
    nonce = os.urandom(_NONCE_BYTES)
    payload = orjson.dumps([blob.key, blob.sha256, blob.size, blob.name, blob.expires])
    sealed = nonce + aead(secret, _LABEL).encrypt(nonce, payload, _LABEL)
    return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()


def unseal(secret: bytes, token: str) -> Blob | None:
    """The blob a token grants, or None when it is not one this secret sealed (expiry not checked)."""
    if len(token) > MAX_TOKEN_CHARS or not _ALPHABET.fullmatch(token):
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except binascii.Error:  # a length no encoding has
        return None
    # One spelling per token: the decoder ignores a last character's unused bits, so without this
    # check a "changed" token could still open.
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != token:
        return None
    try:
        payload = aead(secret, _LABEL).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _LABEL)
    except (ValueError, InvalidTag):  # ValueError: too short to hold a nonce and a tag
        return None
    key, sha256, size, name, expires = orjson.loads(payload)
    return Blob(key=key, sha256=sha256, size=size, name=name, expires=expires)
