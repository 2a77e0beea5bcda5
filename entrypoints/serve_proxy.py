"""The Ray Serve HTTP proxy's start-up hook (issue 24): request heads bounded while they are parsed
(the limits and refusals: serve_app/request_head.py).

Ray builds the proxy's `uvicorn.Config` itself, with no way to choose its HTTP protocol or limits,
and uvicorn's httptools protocol (the one it picks when httptools is installed, as `ray[serve]`
installs it) keeps no limit on a head. Ray's supported hook for code in the proxy process is
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`: a callable it calls once in each proxy, before the
proxy's uvicorn loads its protocol class. `bounded_proxy` is that callable: it names
`BoundedHttpToolsProtocol` as uvicorn's "auto" protocol in that process, and the proxy's
connections then count a head's bytes and fields as they arrive and answer 414/431 (or 400 for a
head that is not HTTP) in OpenAI's envelope the moment a limit is passed, closing the connection
before the rest is read.

`openft serve` sets the variable (`start_ray`) for the local Ray it starts, whose processes inherit
it; a cluster joined at RAY_ADDRESS needs it in the head node's environment (docs/cluster.md, and
deploy/kuberay/raycluster.yaml). The proxy reads its limits from its own environment's `OPENFT_HTTP_*`
settings (defaults otherwise), since Ray passes the callback nothing.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from openft.errors import InvalidRequest, ServiceError
from openft.settings import Settings
from serve_app.request_head import HeadLimits, raw_response

HOOK = f"{__name__}:bounded_proxy"
ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


class _Stop(Exception):
    """Raised from a parser callback to stop the parser; the refusal is the protocol's `_refusal`."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `limits` on each request head (see the module docstring)."""

    limits = HeadLimits.of(Settings.model_construct())  # the defaults; `bounded_proxy` sets the settings'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._raw = self._fields = self._head = 0  # bytes received, fields and their bytes, of the head
        self._refusal: ServiceError | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._raw, self._fields, self._head = True, 0, 0, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._stop_if(self.limits.line(len(self.url)))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        self._head += len(name) + len(value) + 4
        self._stop_if(self.limits.field(self._fields, name, len(value), len(self.url) + self._head))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        super().data_received(data)
        # httptools holds a field until it ends, so a field that never ends is bounded here: by the
        # bytes received while the head is still being read.
        if self._in_head and self._refusal is None:
            self._raw += len(data)
            if (refusal := self.limits.total(self._raw)) is not None:
                self._refuse(refusal)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error: ours when a limit stopped the parser, else a head that
        is not HTTP/1.1, both in OpenAI's envelope."""
        self._refuse(self._refusal or InvalidRequest("The request is not valid HTTP/1.1.", code="invalid_request"))

    def _stop_if(self, refusal: ServiceError | None) -> None:
        if refusal is not None:
            self._refusal = refusal
            raise _Stop()

    def _refuse(self, refusal: ServiceError) -> None:
        self._refusal = refusal
        if not self.transport.is_closing():
            self.transport.write(raw_response(refusal))
            self.transport.close()


def bounded_proxy() -> list:
    """Ray's proxy callback: bounds this proxy's request heads. Returns no Starlette middleware."""
    from uvicorn import config

    BoundedHttpToolsProtocol.limits = HeadLimits.of(Settings())
    config.HTTP_PROTOCOLS["auto"] = f"{__name__}:BoundedHttpToolsProtocol"
    return []
