"""A stored object streamed to the caller with its SHA-256 and size, as every download route sends it;
the adapter and merged-weights downloads also answer a single HTTP Range (RFC 9110 section 14), so
that an interrupted download resumes where it stopped (`openft models download`). Every download
route answers HEAD with the status and headers its GET would send: it opens the object (a missing
one answers 404 as for GET) and reads none of it.

A Range's numbers are bounded before they are converted (serve_app/request_params.py
`bounded_count`): a position of more than 18 digits is past any file's end, never Python's int of
4,301 digits, which raised (an unauthenticated 500 on the blob links, where Range is read before
the token is checked); a header longer than one range can be is ignored."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from fastapi.responses import Response, StreamingResponse

from openft.errors import RangeNotSatisfiable
from serve_app.request_params import BEYOND, bounded_count
from storage.objects import ObjectStore

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
SPAN_CHUNK = 1 << 20
# A single range is `bytes=` and two positions; a longer header is none this server serves.
MAX_RANGE_CHARS = 200


def _position(digits: str) -> int | None:
    return bounded_count(digits) if digits else None


@dataclass(frozen=True)
class ByteRange:
    """One `Range: bytes=first-last` (either end may be empty: `N-` from N on, `-K` the last K)."""

    first: int | None
    last: int | None

    @classmethod
    def parse(cls, header: str | None) -> ByteRange | None:
        """None for no header and for what this server does not serve (several ranges, another unit):
        RFC 9110 lets a server ignore Range and send the whole file with 200."""
        if header is None or len(header) > MAX_RANGE_CHARS:
            return None
        match = _RANGE.fullmatch(header.replace(" ", ""))
        if match is None or match.groups() == ("", ""):
            return None
        first, last = (_position(g) for g in match.groups())
        if first is not None and last is not None and last < first:
            return None  # invalid: ignored, as RFC 9110 says
        return cls(first, last)

    def span(self, size: int) -> tuple[int, int]:
        """[start, end) within a file of `size` bytes; 416 when no byte of it is in the file, saying why."""
        if self.first is None:  # a suffix: the last `last` bytes
            if not self.last:
                raise RangeNotSatisfiable(size, "The range bytes=-0 asks for the last 0 bytes, which is no byte; ask "
                                                "for at least one (bytes=-N with N of 1 or more).")
            if not size:
                raise RangeNotSatisfiable(size, "The file is empty, so no range of it can be sent; request it without "
                                                "Range.")
            return max(size - self.last, 0), size
        if self.first >= size:
            start = "past any file's end" if self.first >= BEYOND else f"at byte {self.first}"
            raise RangeNotSatisfiable(size, f"The range starts {start}, at or past the file's end ({size} bytes); "
                                            f"ask for bytes below {size}.")
        return self.first, size if self.last is None else min(self.last + 1, size)


def iter_span(store: ObjectStore, key: str, start: int, end: int) -> Iterator[bytes]:
    """Bytes [start, end) of `key` in chunks; ObjectNotFound is raised at the call (the first chunk
    is read here), as `iter_chunks` raises it."""
    first = store.read_range(key, start, min(end, start + SPAN_CHUNK))

    def chunks() -> Iterator[bytes]:
        yield first
        pos = start + len(first)
        while pos < end and (block := store.read_range(key, pos, min(end, pos + SPAN_CHUNK))):
            yield block
            pos += len(block)

    return chunks()


def open_object(store: ObjectStore, key: str, size: int, ranged: ByteRange | None) -> Iterator[bytes]:
    """The whole object, or the requested span of it."""
    return store.iter_chunks(key) if ranged is None else iter_span(store, key, *ranged.span(size))


def digest_stream(chunks: Iterable[bytes], *, sha256: str, size: int, name: str | None = None,
                  attachment: bool = False, ranged: ByteRange | bool | None = False,
                  head: bool = False) -> Response:  # fmt: skip
    """`name` picks the media type (JSON for `.json`); `attachment` names it in Content-Disposition.
    `ranged`: False where the route serves no Range; None (a whole file) or the span `chunks` hold
    where it does, which says so in Accept-Ranges. The SHA-256 is always the whole file's. `head`:
    the same status and headers, no body, and `chunks` never read."""
    headers = {"x-gridline-sha256": sha256, "content-length": str(size)}
    status = 200
    if ranged is not False:
        headers["accept-ranges"] = "bytes"
    if isinstance(ranged, ByteRange):
        start, end = ranged.span(size)
        headers.update({"content-range": f"bytes {start}-{end - 1}/{size}", "content-length": str(end - start)})
        status = 206
    if attachment and name:
        headers["content-disposition"] = f'attachment; filename="{name}"'
    media = "application/json" if name and name.endswith(".json") else "application/octet-stream"
    if head:
        getattr(chunks, "close", lambda: None)()
        return Response(status_code=status, media_type=media, headers=headers)
    return StreamingResponse(chunks, status_code=status, media_type=media, headers=headers)
