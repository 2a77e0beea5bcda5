"""Wire objects of API keys (`/v1/gridline/api_keys`, and the admin API's
`/v1/gridline/admin/accounts/{account}/api_keys`): the fields of OpenAI's admin API key
(openai-python `types/admin/organization/admin_api_key.py`), `value` on create only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from serve_app.schemas.billing import NO_NUL

MAX_EXPIRES_IN_S = 10 * 365 * 86400


class ApiKeyCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256, pattern=NO_NUL)
    """What the key is for ("ci", "laptop"): shown in lists, never used to authenticate."""
    expires_in_seconds: StrictInt | None = Field(None, ge=1, le=MAX_EXPIRES_IN_S)
    """Seconds until the key stops working (OpenAI's parameter); omit it for a key that does not expire."""


class ApiKey(BaseModel):
    object: Literal["gridline.api_key"] = "gridline.api_key"
    id: str
    """`key_` followed by 24 hex characters: what revocation names."""
    name: str
    redacted_value: str
    """`sk-openft-...` and the key's last 4 characters; the key itself is shown once, at create."""
    created_at: int
    last_used_at: int | None = None
    """Unix seconds of the key's last authenticated request, to the minute; null when never used."""
    expires_at: int | None = None
    """Unix seconds when the key stops working; null when it does not expire."""


class ApiKeyWithValue(ApiKey):
    value: str
    """The key, `sk-openft-...`: shown here only. Send it as `Authorization: Bearer KEY`."""


class ApiKeyDeleted(BaseModel):
    object: Literal["gridline.api_key.deleted"] = "gridline.api_key.deleted"
    id: str
    deleted: bool
    """True: the key answers 401 on every replica from this answer on."""
