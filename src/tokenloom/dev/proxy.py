"""A small HTTP proxy in front of the local S3 server: latency and injected faults.

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

The proxy is one asyncio event loop on a thread of its own: a request in its latency wait costs
a timer, not a thread; connections to the server are kept alive and reused; bodies are relayed
in chunks of up to 1 MiB as they arrive (no per-byte Python work). So the proxy's CPU stays small
next to the loader and the server it sits between, which share the machine's cores with it.
The gauges (:attr:`FaultProxy.requests`, :attr:`~FaultProxy.body_bytes`,
:meth:`~FaultProxy.in_flight`) say what a client asked of the store.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

__all__ = ["FaultProxy", "InFlight", "KINDS"]

KINDS = ("503", "reset_before", "reset_after", "truncated")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_CHUNK = 1 << 20  # bytes relayed per read
_HEAD_LIMIT = 1 << 20  # longest request or response head accepted
_IDLE_UPSTREAM = 64  # idle server connections kept for reuse


class _Reset(Exception):
    """Reset the client's connection (an injected fault)."""


@dataclass(frozen=True)
class InFlight:
    """Requests the proxy held at once (received, not yet answered), over a period."""

    mean: float
    """Time-weighted mean since the gauge was last reset."""
    peak: int
    seconds: float
    """Length of the period."""


@dataclass
class _Head:
    first: str
    headers: list[tuple[str, str]]

    def get(self, name: str, default: str = "") -> str:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), default)


async def _read_head(reader: asyncio.StreamReader) -> _Head | None:
    """A request or response head, or ``None`` at a clean end of the stream."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise ConnectionError("connection closed inside a message head") from None
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers.append((key.strip(), value.strip()))
    return _Head(lines[0], headers)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


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
        host, _, port = upstream.rpartition(":")
        self.upstream = upstream
        self._target = (host or "127.0.0.1", int(port))
        self.latency = latency_ms / 1000.0
        self.fault_rate = fault_rate
        self.kinds = kinds
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests = 0
        """Requests received (every one, the faulted included)."""
        self.body_bytes = 0
        """Response body bytes relayed to clients."""
        self.faults: Counter[str] = Counter()
        self._held = 0
        self._peak = 0
        self._area = 0.0  # integral of requests held over time
        self._since = self._changed = time.monotonic()
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._clients: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._ready = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def thread_id(self) -> int | None:
        """The native id of the proxy's thread (its CPU time is in
        ``/proc/self/task/<id>/stat`` on Linux); ``None`` before it starts."""
        return self._thread.native_id

    def storage_options(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (the server's options) pointed at this proxy."""
        return {**base, "aws_endpoint": self.endpoint}

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # -- gauges -------------------------------------------------------------------------------

    def in_flight(self, reset: bool = False) -> InFlight:
        """Requests held at once since the last reset (``reset``: start a new period)."""
        with self._lock:
            now = time.monotonic()
            self._area += self._held * (now - self._changed)
            self._changed = now
            span = now - self._since
            out = InFlight(mean=self._area / span if span > 0 else 0.0, peak=self._peak,
                           seconds=span)  # fmt: skip
            if reset:
                self._area, self._since, self._peak = 0.0, now, self._held
        return out

    def _hold(self, delta: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._area += self._held * (now - self._changed)
            self._changed = now
            self._held += delta
            self._peak = max(self._peak, self._held)

    # -- the event loop -----------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(
                self._client, sock=self._sock, limit=_HEAD_LIMIT, backlog=1024
            )

        self._loop.run_until_complete(start())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()

    async def _shutdown(self) -> None:
        """Drop every connection; the requests they carried end on their own (a cancelled
        stream task would be logged as an error by asyncio)."""
        assert self._server is not None
        self._server.close()
        for w in self._clients:
            w.transport.abort()
        for _, w in self._idle:
            w.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(2.0, 2 * self.latency))
            for task in pending:
                task.cancel()

    def _draw(self) -> str | None:
        with self._lock:
            self.requests += 1
            if self._rng.random() >= self.fault_rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.faults[kind] += 1
            return kind

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests one after another (HTTP/1.1 keep-alive)."""
        self._clients.add(writer)
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    break
                self._hold(1)
                try:
                    keep = await self._request(head, reader, writer)
                finally:
                    self._hold(-1)
                if not keep:
                    break
        except _Reset:
            _reset(writer)
            return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that went away (a finished benchmark case)
        finally:
            self._clients.discard(writer)
        writer.close()

    async def _request(
        self, head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Forward one request; whether the client's connection stays open."""
        method = head.first.split(" ", 1)[0]
        if head.get("expect").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body is relayed whole
        body = b""
        if head.get("transfer-encoding").lower() == "chunked":
            body = await _read_chunked(reader)
        elif int(head.get("content-length") or 0):
            body = await reader.readexactly(int(head.get("content-length")))
        if self.latency:
            await asyncio.sleep(self.latency)
        fault = self._draw()
        if fault == "503":
            msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
            writer.write(
                b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg)
            )
            await writer.drain()
            return head.get("connection").lower() != "close"
        if fault == "reset_before":
            raise _Reset
        lines = [head.first]
        for key, value in head.headers:
            if key.lower() not in _HOP and key.lower() not in ("content-length", "expect"):
                lines.append(f"{key}: {value}")
        if body or method in ("PUT", "POST"):
            lines.append(f"Content-Length: {len(body)}")
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        up, status = await self._send_upstream(out)
        up_reader, up_writer = up
        reusable = status.get("connection").lower() != "close"
        code = int(status.first.split(" ", 2)[1])
        no_body = method == "HEAD" or code in (204, 304)
        length = None if no_body else status.get("content-length")
        chunked = not no_body and status.get("transfer-encoding").lower() == "chunked"
        if fault == "reset_after":
            # the server acted; read its answer (so the connection can be reused), then drop
            # the client without one
            if chunked:
                await _read_chunked(up_reader)
            elif length is not None:
                await up_reader.readexactly(int(length))
            elif not no_body:
                await up_reader.read()
                reusable = False
            self._release(up, reusable)
            raise _Reset
        resp = [status.first]
        for key, value in status.headers:
            k = key.lower()
            if k not in _HOP and (no_body or k != "content-length"):
                resp.append(f"{key}: {value}")
        data = None
        if chunked:
            data = await _read_chunked(up_reader)
            length = str(len(data))
        elif length is None and not no_body:
            data = await up_reader.read()  # a body delimited by the server closing
            length, reusable = str(len(data)), False
        if not no_body:
            resp.append(f"Content-Length: {length}")
        writer.write(("\r\n".join(resp) + "\r\n\r\n").encode("latin-1"))
        if no_body:
            self._release(up, reusable)
            await writer.drain()
            return head.get("connection").lower() != "close"
        total = int(length)  # type: ignore[arg-type]
        cut = total // 2 if fault == "truncated" and total > 1 else total
        sent = 0
        if data is not None:
            writer.write(data[:cut])
            sent = cut
        else:
            while sent < total:
                chunk = await up_reader.read(min(_CHUNK, total - sent))
                if not chunk:
                    up_writer.transport.abort()
                    raise ConnectionError("the server closed inside a response body")
                if sent < cut:
                    writer.write(chunk[: cut - sent])
                sent += len(chunk)
                await writer.drain()
            self._release(up, reusable)
        with self._lock:
            self.body_bytes += min(cut, total)
        await writer.drain()
        if cut < total:
            raise _Reset
        if data is not None:
            self._release(up, reusable)
        return head.get("connection").lower() != "close"

    async def _send_upstream(
        self, request: bytes
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], _Head]:
        """Send ``request`` to the server and read the response head (interim ``1xx`` heads
        skipped)."""
        up, status = await self._exchange(request)
        while status.first.split(" ", 2)[1].startswith("1"):
            head = await _read_head(up[0])
            if head is None:
                raise ConnectionError("the server closed the connection without a response")
            status = head
        return up, status

    async def _exchange(
        self, request: bytes
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], _Head]:
        """Send ``request`` on an idle server connection (or a new one) and read the first
        response head. A reused connection the server closed meanwhile is retried on a new one
        (the server never saw the request)."""
        while self._idle:
            up = self._idle.pop()
            try:
                up[1].write(request)
                await up[1].drain()
                status = await _read_head(up[0])
            except (ConnectionError, asyncio.IncompleteReadError):
                status = None
            if status is not None:
                return up, status
            up[1].transport.abort()
        up = await asyncio.open_connection(*self._target, limit=_HEAD_LIMIT)
        up[1].write(request)
        await up[1].drain()
        status = await _read_head(up[0])
        if status is None:
            up[1].transport.abort()
            raise ConnectionError("the server closed the connection without a response")
        return up, status

    def _release(
        self, up: tuple[asyncio.StreamReader, asyncio.StreamWriter], reusable: bool
    ) -> None:
        if reusable and len(self._idle) < _IDLE_UPSTREAM and not up[1].is_closing():
            self._idle.append(up)
        else:
            up[1].transport.abort()
