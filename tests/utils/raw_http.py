"""Raw HTTP/1.1 over a socket, for what an HTTP client library refuses to send (2,000 headers, a
16 MiB header, a malformed head): the request is written in pieces while the answer is watched for,
so a server that answers before the request is all sent is seen doing so."""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass

import orjson


@dataclass
class RawAnswer:
    status: int | None  # None: the connection closed with no answer
    headers: dict[str, str]
    body: bytes
    sent: int  # request bytes written when the answer began (or the server stopped reading)
    seconds: float  # from the first byte written to the whole answer read

    def error(self) -> dict:
        return orjson.loads(self.body)["error"]


def _parse(raw: bytes) -> tuple[int | None, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 "):
        return None, {}, raw
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode().strip().lower()] = value.decode().strip()
    length = int(headers.get("content-length", len(body)))
    return int(lines[0].split()[1]), headers, body[:length]


def exchange(port: int, request: bytes, *, piece: int = 1 << 16, timeout: float = 60) -> RawAnswer:
    """Write `request` to 127.0.0.1:`port` in pieces until the server answers or stops reading, then
    read one answer (up to its content-length, or until the server closes)."""
    started = time.monotonic()
    deadline = started + timeout
    sent, raw = 0, b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.setblocking(False)
        while sent < len(request) and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break
            if writable:
                try:
                    sent += sock.send(request[sent:sent + piece])
                except (BrokenPipeError, ConnectionResetError):
                    break
        sock.setblocking(True)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            raw += chunk
            status, headers, body = _parse(raw)
            if status is not None and "content-length" in headers and len(body) >= int(headers["content-length"]):
                break
    status, headers, body = _parse(raw)
    return RawAnswer(status, headers, body, sent, time.monotonic() - started)


def head(target: str, fields: list[tuple[str, str]] | None = None, *, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", *(f"{n}: {v}" for n, v in fields or [])]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
