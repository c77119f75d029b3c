"""The bytes of one input file as lines, with memory bounded by the record limit.

Decompression is done here step by step with a bounded output per step — gzip with any number
of members (parsed here, so a bad trailer costs no data), zstd with any number of frames, skippable
frames and windows up to 2 GiB (``zstd --long=31``), fed one block at a time for the same reason.
Lines are read with a bounded ``readline``: a line longer than the limit is skipped while reading
(only its length is kept), so neither a decompression bomb nor an endless line can take more
memory than about one record.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["StreamError", "LineStream", "open_lines"]

_IN = 1 << 18  # compressed bytes read per step
_OUT = 1 << 20  # most decompressed bytes one step may produce
_DRAIN = 1 << 20  # bytes read per step while skipping an overlong line
_PIECE = 1 << 20  # bytes read per step while gathering a line
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_MAX_WINDOW = 1 << 31  # what `zstd --long=31` writes
_ZSTD_BLOCK_MAX = 1 << 17


class StreamError(Exception):
    """The compressed stream is corrupt or cut short; every byte before the break was delivered."""


@dataclass
class LineStream:
    """Lines of one (possibly compressed) file.

    Iterating yields ``(line, nbytes)``: the line without its newline (a ``bytearray`` the
    caller owns), or ``None`` when it is longer than ``limit`` bytes (then it was skipped: at most
    ``limit`` bytes of it were ever held, and only until the limit was passed), and the bytes it
    took in the decompressed stream (newline included). A :class:`StreamError` (or ``OSError``)
    ends the iteration after every complete line before the break.
    """

    stream: BinaryIO
    limit: int
    problems: list[str] = field(default_factory=list)
    """Non-fatal findings (a bad gzip trailer or zstd checksum), filled while reading."""

    def __iter__(self) -> Iterator[tuple[bytearray | None, int]]:
        # A line is gathered in pieces of at most _PIECE bytes into one bytearray that grows in
        # place (no join of pieces, no copy to drop the newline: ``readline(limit)`` would hold
        # the line about twice over), and is abandoned as soon as it passes the limit.
        readline = self.stream.readline
        while True:
            piece = readline(min(_PIECE, self.limit + 1))
            if not piece:
                return
            line = bytearray(piece)
            del piece
            while not line.endswith(b"\n") and len(line) <= self.limit:
                piece = readline(min(_PIECE, self.limit + 1 - len(line)))
                if not piece:
                    break
                line += piece
            n = len(line)
            if n > self.limit and not (n == self.limit + 1 and line.endswith(b"\n")):
                del line  # too long: skip the rest of the line, keeping nothing
                ended = False
                while not ended:
                    more = readline(_DRAIN)
                    n += len(more)
                    ended = not more or more.endswith(b"\n")
                yield None, n
                continue
            if line.endswith(b"\n"):
                del line[-1]  # in place: the buffer is not copied
            box = [line]
            del line  # handed over: this frame keeps no reference while the caller works
            yield box.pop(), n


def open_lines(raw: BinaryIO, compression: str, limit: int) -> LineStream:
    """A :class:`LineStream` over ``raw`` (an open binary file), decompressing ``.gz``/``.zst``."""
    if not compression:
        return LineStream(raw, limit)
    problems: list[str] = []
    chunks = _gunzip(raw, problems) if compression == ".gz" else _unzstd(raw, problems)
    stream = io.BufferedReader(_ChunkReader(chunks), buffer_size=_OUT)
    return LineStream(stream, limit, problems)


class _ChunkReader(io.RawIOBase):
    """A raw, readable stream over an iterator of byte chunks (exceptions pass through)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001 - a writable buffer
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._buf = memoryview(nxt)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _Source:
    """Compressed bytes with push-back (what a decoder did not use goes back in front)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._pending = b""
        self.consumed = 0

    def read(self, n: int = _IN) -> bytes:
        if self._pending:
            out, self._pending = self._pending[:n], self._pending[n:]
        else:
            out = self._raw.read(n)
        self.consumed += len(out)
        return out

    def read_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            more = self.read(n - len(out))
            if not more:
                break
            out += more
        return out

    def unread(self, data: bytes) -> None:
        self._pending = data + self._pending
        self.consumed -= len(data)


def _gunzip(raw: BinaryIO, problems: list[str]) -> Iterator[bytes]:
    """Decompressed chunks of every gzip member; trailers are checked here, not by zlib."""
    src = _Source(raw)
    member = 0
    while True:
        start = src.consumed
        head = src.read_exact(10)
        if not head:
            return
        if head[:2] != b"\x1f\x8b" or len(head) < 10 or head[2] != 8:
            rest = head + src.read(_IN)
            if member and not rest.strip(b"\x00"):
                return  # zero padding after the last member, as gzip(1) tolerates
            raise StreamError(f"no gzip member at byte {start} of the compressed file")
        member += 1
        _skip_gzip_header_fields(src, head[3])
        dec = zlib.decompressobj(-zlib.MAX_WBITS)
        crc = size = 0
        while not dec.eof:
            data = dec.unconsumed_tail or src.read()
            snapshot = dec.copy()
            try:
                out = dec.decompress(data, _OUT)
            except zlib.error as exc:
                yield from _salvage(snapshot, data)
                raise StreamError(f"corrupt gzip data in member {member}: {exc}") from exc
            if out:
                crc = zlib.crc32(out, crc)
                size += len(out)
                yield out
            elif not data:
                raise StreamError(f"gzip member {member} is cut short (truncated file)")
        src.unread(dec.unused_data)
        trailer = src.read_exact(8)
        if len(trailer) < 8:
            problems.append(f"gzip member {member} has no trailer (file cut after its data)")
            return
        if trailer != crc.to_bytes(4, "little") + (size & 0xFFFFFFFF).to_bytes(4, "little"):
            problems.append(f"gzip member {member}: CRC/size trailer does not match its data")


def _skip_gzip_header_fields(src: _Source, flags: int) -> None:
    if flags & 4:  # FEXTRA
        src.read_exact(int.from_bytes(src.read_exact(2), "little"))
    for flag in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & flag:
            while (byte := src.read_exact(1)) and byte != b"\x00":
                pass
    if flags & 2:  # FHCRC
        src.read_exact(2)


def _salvage(dec, data: bytes) -> Iterator[bytes]:  # noqa: ANN001 - a zlib decompress object
    """Replay ``data`` in small steps up to the corrupt byte, so output before it is not lost."""
    for i in range(0, len(data), 64):
        try:
            out = dec.decompress(data[i : i + 64])
        except zlib.error:
            return
        if out:
            yield out


def _unzstd(raw: BinaryIO, problems: list[str]) -> Iterator[bytes]:
    """Decompressed chunks of every zstd frame, fed one block at a time (bounded output)."""
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    src = _Source(raw)
    frame = 0
    while True:
        start = src.consumed
        magic = src.read_exact(4)
        if not magic:
            return
        number = int.from_bytes(magic.ljust(4, b"\x00"), "little")
        if len(magic) == 4 and 0x184D2A50 <= number <= 0x184D2A5F:  # a skippable frame
            _skip(src, int.from_bytes(src.read_exact(4), "little"))
            continue
        if magic != _ZSTD_MAGIC:
            raise StreamError(f"no zstd frame at byte {start} of the compressed file")
        frame += 1
        descriptor = src.read_exact(1)
        if not descriptor:
            raise StreamError(f"zstd frame {frame} is cut short (truncated file)")
        fhd = descriptor[0]
        single_segment = fhd >> 5 & 1
        header_rest = (
            (0 if single_segment else 1)
            + (0, 1, 2, 4)[fhd & 3]
            + ((1 if single_segment else 0), 2, 4, 8)[fhd >> 6]
        )
        dec = dctx.decompressobj()
        try:
            dec.decompress(magic + descriptor + src.read_exact(header_rest))
            while True:
                block_header = src.read_exact(3)
                header = int.from_bytes(block_header.ljust(3, b"\x00"), "little")
                kind, size = header >> 1 & 3, header >> 3
                body = src.read_exact(1 if kind == 1 else size) if kind != 3 else b""
                if len(block_header) < 3 or len(body) < (1 if kind == 1 else size):
                    raise StreamError(f"zstd frame {frame} is cut short (truncated file)")
                if kind == 3 or size > _ZSTD_BLOCK_MAX:
                    raise StreamError(f"corrupt zstd block in frame {frame}")
                out = dec.decompress(block_header + body)  # at most one block: <= 128 KiB
                if out:
                    yield out
                if header & 1:
                    break
        except zstandard.ZstdError as exc:
            raise StreamError(f"corrupt zstd data in frame {frame}: {exc}") from exc
        if fhd >> 2 & 1:  # content checksum: checked last, after every block was delivered
            checksum = src.read_exact(4)
            try:
                if len(checksum) < 4:
                    problems.append(f"zstd frame {frame} has no checksum (file cut after its data)")
                    return
                dec.decompress(checksum)
            except zstandard.ZstdError as exc:
                problems.append(f"zstd frame {frame}: {exc}")


def _skip(src: _Source, n: int) -> None:
    while n > 0:
        got = src.read(min(n, _IN))
        if not got:
            raise StreamError("a skippable zstd frame is cut short (truncated file)")
        n -= len(got)
