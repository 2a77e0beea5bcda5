"""Incremental multipart/form-data parsing over a request body stream.

Starlette's `request.form()` spools the whole upload to a temporary file before the handler sees
a byte; here the body is parsed as it arrives, so a file is validated, hashed and written to the
object store in one pass and a bad line fails the upload without reading the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from python_multipart.multipart import MultipartParser, parse_options_header

from openft.errors import InvalidRequest


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


def boundary_of(content_type: str | None) -> bytes:
    ctype, options = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data" or b"boundary" not in options:
        raise InvalidRequest(
            "Uploads are multipart/form-data with a `file` part and a `purpose` field.",
            code="invalid_request", param="file",
        )
    return options[b"boundary"]


class MultipartStream:
    """Feed raw body chunks; get back the parts' events in order."""

    def __init__(self, boundary: bytes):
        self._events: list[Event] = []
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._on_part_begin,
                "on_header_field": lambda d, s, e: self._append_field(d[s:e]),
                "on_header_value": lambda d, s, e: self._append_value(d[s:e]),
                "on_header_end": self._on_header_end,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": lambda d, s, e: self._events.append(PartData(bytes(d[s:e]))),
                "on_part_end": lambda: self._events.append(PartEnd()),
            },
        )

    def _append_field(self, b: bytes) -> None:
        self._header_field += b

    def _append_value(self, b: bytes) -> None:
        self._header_value += b

    def _on_part_begin(self) -> None:
        self._headers = {}

    def _on_header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = self._header_value = b""

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        self._events.append(PartStart(name, filename.decode("utf-8", "replace") if filename is not None else None))

    def feed(self, chunk: bytes) -> list[Event]:
        self._parser.write(chunk)
        events, self._events = self._events, []
        return events

    def finish(self) -> list[Event]:
        self._parser.finalize()
        events, self._events = self._events, []
        return events
