"""A small stdlib HTTP proxy in front of the local S3 server: latency and injected faults.

Used by the object-store tests (faults) and ``tokenloom bench loader --store s3`` (latency).

Every request waits ``latency_ms``; a fraction ``fault_rate`` of them fails, the kind drawn from
``kinds`` with a seeded generator:

* ``503`` — answered ``503 Slow Down`` without reaching the server;
* ``reset_before`` — the connection is reset before the server saw the request;
* ``reset_after`` — the server acted (a PUT stored, a commit made), then the client's connection
  is reset before any response: the ambiguous case a writer must resolve without duplicating;
* ``truncated`` — the server's response is cut after half of its body (Content-Length kept).

The ``Host`` header is forwarded unchanged, so SigV4 signatures made for the proxy's address stay
valid at the server.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FaultProxy"]

KINDS = ("503", "reset_before", "reset_after", "truncated")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class _Reset(Exception):
    pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that went away mid-response (a finished benchmark case)
        super().handle_error(request, client_address)


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (``host:port``) with latency and faults."""

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float = 0.0,
        fault_rate: float = 0.0,
        kinds: tuple[str, ...] = KINDS,
        seed: int = 0,
    ) -> None:
        self.upstream = upstream
        self.latency = latency_ms / 1000.0
        self.fault_rate = fault_rate
        self.kinds = kinds
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests = 0
        self.faults: Counter[str] = Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (the server's options) pointed at this proxy."""
        return {**base, "aws_endpoint": self.endpoint}

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- one request --------------------------------------------------------------------------

    def _draw(self) -> str | None:
        with self._lock:
            self.requests += 1
            if self._rng.random() >= self.fault_rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.faults[kind] += 1
            return kind

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = self._read_body(h)
        if self.latency:
            time.sleep(self.latency)
        fault = self._draw()
        if fault == "503":
            msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
            h.send_response(503)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(msg)))
            h.end_headers()
            h.wfile.write(msg)
            return
        if fault == "reset_before":
            return self._reset(h)
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for key, value in h.headers.items():
                if key.lower() not in _HOP:
                    conn.putheader(key, value)
            if body is not None and "content-length" not in {k.lower() for k in h.headers}:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            status, headers = resp.status, resp.getheaders()
        finally:
            conn.close()
        if fault == "reset_after":
            return self._reset(h)
        h.send_response(status)
        head = h.command == "HEAD"  # its Content-Length is the object's, with no body
        for key, value in headers:
            if key.lower() not in _HOP and (head or key.lower() != "content-length"):
                h.send_header(key, value)
        if not head:
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if head:
            return
        if fault == "truncated" and len(data) > 1:
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            return self._reset(h)
        h.wfile.write(data)

    @staticmethod
    def _read_body(h: BaseHTTPRequestHandler) -> bytes | None:
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(h.rfile.read(size))
                h.rfile.readline()
        length = int(h.headers.get("Content-Length") or 0)
        return h.rfile.read(length) if length else (b"" if h.command in ("PUT", "POST") else None)

    @staticmethod
    def _reset(h: BaseHTTPRequestHandler) -> None:
        """Close with RST (SO_LINGER 0), as a dropped connection looks to the client."""
        try:
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        h.close_connection = True
        try:
            h.connection.close()
        except OSError:
            pass
