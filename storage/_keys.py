"""Object keys and byte ranges: the checks every backend runs before touching storage, and the not-found error.

A key is a relative POSIX path (`files/acct/file-abc`). Rejecting absolute paths, `.`/`..` and
empty segments here is what keeps a key from ever escaping a local root or an S3 prefix.
"""

from __future__ import annotations

# In-progress local writes live under this first segment; no key may name it on any backend,
# so a store behaves the same whichever backend it is.
TMP_SEGMENT = ".tmp"


class ObjectNotFound(KeyError):
    """No object under this key; the service layer maps it to its own NotFound."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"no object under key {self.key!r}"


def check_key(key: str) -> str:
    """Return `key` unchanged if it is a safe relative POSIX path, else raise ValueError."""
    if not isinstance(key, str) or not key:
        raise ValueError("object key must be a non-empty string")
    _check_segments(key.split("/"), what="object key")
    return key


def check_prefix(prefix: str) -> str:
    """Like `check_key`, but "" (everything) and a trailing "/" (a directory) are allowed."""
    if not isinstance(prefix, str):
        raise ValueError("object key prefix must be a string")
    if prefix:
        segments = prefix.split("/")
        if segments[-1] == "":
            segments.pop()
        _check_segments(segments, what="object key prefix")
    return prefix


def _check_segments(segments: list[str], *, what: str) -> None:
    if segments[0] == "":
        raise ValueError(f"{what} must be relative: remove the leading '/'")
    if segments[0] == TMP_SEGMENT:
        raise ValueError(f"{what} may not start with {TMP_SEGMENT!r}: it is reserved for in-progress writes")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError(f"{what} has an empty, '.' or '..' segment; use a plain relative path like 'files/acct/x'")
        if "\x00" in segment:
            raise ValueError(f"{what} contains a NUL character")


def check_range(start: int, end: int) -> None:
    """A `read_range` argument pair is the half-open byte range [start, end)."""
    if start < 0 or end < start:
        raise ValueError(f"byte range [{start}, {end}) is invalid: need 0 <= start <= end")
