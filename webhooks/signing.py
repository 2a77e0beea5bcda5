"""Standard Webhooks signatures, as the official SDK checks them (openai-python
`lib/_webhooks.py`, `client.webhooks.verify_signature`): headers `webhook-id`,
`webhook-timestamp` (unix seconds; the SDK refuses one more than 5 minutes off, so each attempt
is signed when it is sent) and `webhook-signature`, space-separated `v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">` under the secret `whsec_<base64 key>` decoded."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def hint(secret: str) -> str:
    """What list and retrieve show of a secret (the whole of it is shown once, at create and rotate)."""
    return f"{SECRET_PREFIX}...{secret[-4:]}"


def signature(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(keys: tuple[str, ...], msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The delivery's headers, signed with every key that is valid now (a rotation may keep the old one)."""
    return {"content-type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(k, msg_id, timestamp, body) for k in keys)}
