"""A raw-socket upload that trickles its body (or sends none of it): the slow client of issue 12."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

PREAMBLE = (
    b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
    b'--XX\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n'
    b"Content-Type: application/octet-stream\r\n\r\n"
)


@dataclass
class SlowUpload:
    """One raw-socket upload declaring a 1 MB body and sending one byte a second (or none)."""

    url: str
    key: str
    trickle: bool = True
    response: bytes = b""
    answered_at: float | None = None  # monotonic time of the first response byte
    closed_at: float | None = None  # the server's EOF
    thread: threading.Thread = field(init=False)

    def start(self) -> "SlowUpload":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        u = urlparse(self.url)
        with socket.create_connection((u.hostname, u.port)) as sock:
            sock.sendall(
                f"POST {u.path}/files HTTP/1.1\r\nHost: {u.hostname}\r\nAuthorization: Bearer {self.key}\r\n"
                f"Content-Type: multipart/form-data; boundary=XX\r\nContent-Length: 1000000\r\n\r\n".encode() + PREAMBLE
            )
            sock.settimeout(1.0)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    if self.trickle and self.answered_at is None:
                        try:
                            sock.sendall(b"{")
                        except OSError:  # closed under us: the EOF is read next
                            pass
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.closed_at = time.monotonic()
                    return
                self.answered_at = self.answered_at or time.monotonic()
                self.response += data

    def status_and_error(self) -> tuple[int, dict]:
        head, _, body = self.response.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" in head.lower():  # one chunk: size line, data, terminator
            body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
        return status, json.loads(body)["error"]
