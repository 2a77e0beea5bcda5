"""Resumable, verified downloads for the user CLI: each file goes to `<name>.part`, resumes from that
file's size with an HTTP Range (the adapter and merged-weights routes answer 206; serve_app/downloads.py),
is checked against the SHA-256 the API publishes (`x-gridline-sha256` on every download response, and
`files[].sha256` of a merge) and only then renamed to its name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import openai

from entrypoints._progress import byte_bar

_HASH_BLOCK = 1 << 20


class DigestMismatch(Exception):
    """The downloaded bytes do not hash to the published SHA-256; the .part file was removed."""


def _api_error(response: httpx.Response) -> openai.APIStatusError:
    """The API's refusal as the SDK raises it, so that the CLI prints every error the same way."""
    response.read()
    try:
        body = response.json().get("error")
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else f"HTTP {response.status_code}"
    return openai.APIStatusError(message, response=response, body=body)


def _hash_of(path: Path) -> hashlib._Hash:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest


def download_file(http: httpx.Client, url: str, dest: Path, *, sha256: str | None = None,
                  say=print) -> str:  # fmt: skip
    """Download `url` to `dest`; returns the verified hex SHA-256. `sha256`, when known beforehand,
    must match the response's `x-gridline-sha256` too. A .part file that is not a prefix of the file
    (its digest fails) is removed, so that the next run starts from zero."""
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    with http.stream("GET", url, headers=headers) as response:
        if response.status_code == 416:  # the .part is as long as the file, or longer: start over
            part.unlink()
            return download_file(http, url, dest, sha256=sha256, say=say)
        if response.status_code not in (200, 206):
            raise _api_error(response)
        published = response.headers.get("x-gridline-sha256")
        if sha256 and published and published != sha256:
            raise DigestMismatch(f"{dest.name}: the download's SHA-256 differs from the one listed for it")
        expected = sha256 or published
        if response.status_code == 206 and response.headers.get("content-range", "").startswith(f"bytes {have}-"):
            say(f"resuming {dest.name} at byte {have}")
            digest, mode = _hash_of(part), "ab"
        else:  # 200: the server sent the whole file (no .part, or it ignored the Range)
            have, digest, mode = 0, hashlib.sha256(), "wb"
        total = have + int(response.headers.get("content-length", 0))
        with part.open(mode) as out, byte_bar(total, dest.name, initial=have) as bar:
            for chunk in response.iter_bytes():
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    got = digest.hexdigest()
    if expected is None or got != expected:
        part.unlink()
        raise DigestMismatch(f"{dest.name}: SHA-256 {got} does not match the published {expected}; "
                             "the partial file was removed, run the download again")  # fmt: skip
    part.replace(dest)
    return got
