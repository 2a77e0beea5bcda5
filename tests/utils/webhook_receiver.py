"""Real webhook receivers for tests, on 127.0.0.1: an HTTP server in a thread that checks every
delivery with the official SDK (`client.webhooks.unwrap`, the same call a user's receiver makes)
and answers from a script (e.g. 500, 500, then 200); and `Trickler`, which never finishes answering."""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai

from tests.utils.polling import until

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")


@dataclass
class Received:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    event: object | None  # the SDK's parsed event, or None when the signature did not verify
    error: str | None  # the SDK's exception class name when it refused the delivery


@dataclass
class Receiver:
    secret: str | None = None
    answers: list[int] = field(default_factory=list)  # answered in order; 200 once it runs out
    delay_s: float = 0.0  # how long each answer takes
    delays: list[float] = field(default_factory=list)  # the first answers' delays, in order; then delay_s
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                event, error = None, None
                try:
                    event = SDK.webhooks.unwrap(body, headers, secret=receiver.secret)
                except Exception as exc:  # recorded: a test asserts on it
                    error = type(exc).__name__
                with receiver.lock:
                    receiver.received.append(Received(time.time(), self.path, headers, body, event, error))
                    code = receiver.answers.pop(0) if receiver.answers else 200
                    delay = receiver.delays.pop(0) if receiver.delays else receiver.delay_s
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(code)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):  # the sender timed out first
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    def wait_for(self, n: int, timeout: float = 60) -> list[Received]:
        return until(lambda: (got := self.events()) and len(got) >= n and got, f"{n} deliveries", timeout, 0.05)


@dataclass
class Trickler:
    """A receiver that never finishes answering: it sends a status line at once, then one byte of a
    header line every `interval_s`, for as long as the sender stays (issue 24's hostile receiver).
    `open` is how many connections it holds now, `connections` how many it was sent."""

    interval_s: float = 2.0
    connections: int = 0
    open: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop_event: threading.Event = field(default_factory=threading.Event)
    sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks"

    def start(self) -> "Trickler":
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with self.lock:
            self.connections += 1
            self.open += 1
        try:
            with conn:
                conn.recv(65536)  # the request; what it says does not matter here
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not self.stop_event.is_set():
                    readable, _, _ = select.select([conn], [], [], self.interval_s)
                    if readable and not conn.recv(65536):
                        break  # the sender gave up: what a deadline does
                    conn.sendall(b"x")
        except OSError:  # reset by the sender
            pass
        finally:
            with self.lock:
                self.open -= 1

    def stop(self) -> None:
        self.stop_event.set()
        self.sock.close()
