"""uvicorn's HTTP/1.1 protocol (h11), answering what it cannot parse with an OpenAI-style JSON error.

Stock uvicorn answers a request h11 refuses (a broken request line, a header without a colon, a
non-numeric Content-Length, headers beyond `h11_max_incomplete_event_size`) with a plain-text 400
and closes at once; a client still sending (a 128 KiB header) then gets a reset instead of the
answer. `JsonErrorH11Protocol` answers 431 when the headers outgrew the parser's buffer and 400
otherwise, both as `{"error": {...}}`, then closes lingeringly: it half-closes, discards what
still arrives, and drops the connection `LINGER_S` later (what nginx's lingering_close does).
Headers under the buffer but over `limits.MAX_HEADER_BYTES` reach the app and get their 431 there.
The servers load no WebSocket protocol (`ws="none"`): an `Upgrade` request is served as the plain
HTTP request it also is, logged at debug level (uvicorn warns twice a request, a log flood to order).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvstrata.serving.errors import error_body
from kvstrata.serving.limits import PARSER_BUFFER_BYTES

logger = logging.getLogger(__name__)
LINGER_S = 2.0
DEFAULT_MAX_INCOMPLETE_EVENT_SIZE = 16 * 1024  # h11's own default


def protocol_settings() -> dict[str, Any]:
    """uvicorn.Config's protocol arguments for the rank and the gateway alike: this h11 protocol with the
    parser buffer `limits` sizes (JSON 400/431 beyond it), and no WebSocket protocol (no route needs one, so
    no WebSocket library loads)."""
    return {"http": JsonErrorH11Protocol, "h11_max_incomplete_event_size": PARSER_BUFFER_BYTES, "ws": "none"}


class JsonErrorH11Protocol(H11Protocol):
    _rejected = False
    _linger: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._rejected:  # after an error answer: read and drop, so the client sees no reset
            return
        super().data_received(data)

    def _unsupported_upgrade_warning(self) -> None:
        logger.debug("upgrade_ignored client=%s", self.client)

    def send_400_response(self, msg: str) -> None:
        pending, _ = self.conn.trailing_data
        limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        if len(pending) > limit:
            status, code = 431, "headers_too_large"
            text = f"the request line and headers are larger than {limit} bytes; send fewer or shorter headers"
        else:
            status, code = 400, "invalid_http"
            text = "the request is not valid HTTP/1.1 (request line, headers or Content-Length); fix the client"
        logger.info("http_refused status=%d client=%s", status, self.client)
        body = json.dumps(error_body(text, "invalid_request_error", code=code)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            events = [h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()]
            out = b"".join(self.conn.send(event) or b"" for event in events)
        except h11.LocalProtocolError:  # a response had already started: nothing valid can follow
            self.transport.close()
            return
        self.transport.write(out)
        self._rejected = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)
