"""Incremental multipart/form-data parsing over a request body stream.

Starlette's `request.form()` spools the whole upload to a temporary file before the handler sees
a byte; here the body is parsed as it arrives, so a file is validated, hashed and written to the
object store in one pass and a bad line fails the upload without reading the rest.

This module owns the framing rules, so that every malformed form is one `400` with a code and
never reaches python-multipart's own errors unhandled:
- the Content-Type and each part's Content-Disposition parse strictly: token or quoted-string
  parameter values, no parameter twice (two `boundary` or two `name` parameters would let two
  parsers read one body two ways), a boundary of 1-70 of RFC 2046's characters;
- part headers are capped (count and line length), parts are capped (`max_parts`), field names
  are at most 64 characters (they are named back in errors);
- `finish` refuses a body that never reached its closing boundary (`incomplete_upload`): a
  truncated body is never taken for a whole one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser

from openft.errors import InvalidRequest

MAX_BOUNDARY_CHARS = 70  # RFC 2046 §5.1.1
MAX_PART_HEADERS = 8
# One part header line: a Content-Disposition with a 512-character filename fits.
MAX_PART_HEADER_BYTES = 2048
MAX_FIELD_NAME_CHARS = 64

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE = re.compile(rf"\s*({_TOKEN}(?:/{_TOKEN})?)\s*")
# Unquoted values are taken leniently (JavaMail's boundaries hold `=`), quoted ones per RFC 9110.
_PARAM = re.compile(rf'\s*;\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^;"\s]+)\s*')
_END = re.compile(r"\s*;?\s*")
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_ESCAPE = re.compile(r"\\(.)")

# The parser logs each framing error with the offending bytes: user data, kept out of the logs.
# Its errors are answered as `invalid_multipart` here instead.
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)


@dataclass
class PartStart:
    name: str
    filename: str | None


@dataclass
class PartData:
    data: bytes


@dataclass
class PartEnd:
    pass


Event = PartStart | PartData | PartEnd


def malformed(why: str) -> InvalidRequest:
    return InvalidRequest(f"The multipart body is malformed: {why}", code="invalid_multipart", param=None)


def incomplete() -> InvalidRequest:
    return InvalidRequest(
        "The upload ended before the multipart body's closing boundary; nothing was stored. Send the whole body again.",
        code="incomplete_upload", param="file",
    )


def parse_header_params(value: str) -> tuple[str, dict[str, str]] | None:
    """`type; name=value; ...` as (lowercased type, {lowercased name: value}); None when the header
    does not parse (an unclosed quote, stray text) or names a parameter twice."""
    m = _MEDIA_TYPE.match(value)
    if m is None:
        return None
    media, pos, params = m.group(1).lower(), m.end(), {}
    while (m := _PARAM.match(value, pos)) is not None:
        name, raw = m.group(1).lower(), m.group(2)
        if name in params:
            return None
        params[name] = _ESCAPE.sub(r"\1", raw[1:-1]) if raw.startswith('"') else raw
        pos = m.end()
    return (media, params) if _END.fullmatch(value, pos) else None


def boundary_of(content_type: str | None) -> bytes:
    if (content_type or "").split(";", 1)[0].strip().lower() != "multipart/form-data":
        raise InvalidRequest(
            "Uploads are multipart/form-data with a `file` part and a `purpose` field.",
            code="invalid_request", param="file",
        )
    parsed = parse_header_params(content_type)
    if parsed is None:
        raise malformed("the Content-Type header does not parse (an unclosed quote, or a parameter sent twice).")
    boundary = parsed[1].get("boundary")
    if boundary is None or not _BOUNDARY.fullmatch(boundary):
        raise malformed(f"the Content-Type needs a boundary of 1 to {MAX_BOUNDARY_CHARS} of the characters "
                        "RFC 2046 allows.")
    return boundary.encode("ascii")


def _text(raw: str) -> str:
    # Header bytes arrive as latin-1 text; clients send names and filenames as UTF-8.
    return raw.encode("latin-1").decode("utf-8", "replace")


class MultipartStream:
    """Feed raw body chunks; get back the parts' events in order."""

    def __init__(self, boundary: bytes, *, max_parts: int):
        self._events: list[Event] = []
        self._max_parts = max_parts
        self._parts = 0
        self._ended = False
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._disposition: bytes | None = None
        self._parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._on_part_begin,
                "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
                "on_header_end": self._on_header_end,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": lambda d, s, e: self._events.append(PartData(bytes(d[s:e]))),
                "on_part_end": lambda: self._events.append(PartEnd()),
                "on_end": self._on_end,
            },
            max_header_count=MAX_PART_HEADERS,
            max_header_size=MAX_PART_HEADER_BYTES,
        )

    def _on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > self._max_parts:
            raise InvalidRequest(
                f"An upload's form has at most {self._max_parts} parts: `file`, `purpose` and a few others.",
                code="too_many_fields", param=None,
            )
        self._disposition = None

    def _on_header_end(self) -> None:
        if bytes(self._header_field).lower() == b"content-disposition":
            if self._disposition is not None:
                raise malformed("a part has two Content-Disposition headers.")
            self._disposition = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        parsed = None if self._disposition is None else parse_header_params(self._disposition.decode("latin-1"))
        if parsed is None or parsed[0] != "form-data" or "name" not in parsed[1]:
            raise malformed("each part needs one Content-Disposition: form-data header with a name.")
        name = _text(parsed[1]["name"])
        if len(name) > MAX_FIELD_NAME_CHARS:
            raise InvalidRequest(f"A form field's name is over {MAX_FIELD_NAME_CHARS} characters.",
                                 code="invalid_request", param=None)
        filename = parsed[1].get("filename")
        self._events.append(PartStart(name, _text(filename) if filename is not None else None))

    def _on_end(self) -> None:
        self._ended = True

    def feed(self, chunk: bytes) -> list[Event]:
        try:
            self._parser.write(chunk)
        except FormParserError:
            # The parser's own message quotes the offending bytes: user data, never echoed.
            raise malformed("the body does not follow multipart/form-data framing for its boundary.") from None
        events, self._events = self._events, []
        return events

    def finish(self) -> list[Event]:
        """The last events; refuses a body that ended before its closing boundary."""
        if not self._ended:
            raise incomplete() if self._parts else malformed("the body holds no part opened by its boundary.")
        events, self._events = self._events, []
        return events
