"""NRI's connection multiplexer: two logical byte streams over one unix socket.

Frame: 8-byte header, `u32 conn id | u32 payload length` (big-endian), then the payload.
Conn 1 carries the plugin's ttrpc server, conn 2 its ttrpc client. Unknown conn ids are
dropped, as the runtime does.

Writing follows the runtime's reader: Go reads a frame through a 4096-byte buffer, so a ttrpc
message is never put in a frame with another, a message of up to 4096 bytes goes as one frame,
and a longer one as its first 4096 bytes, then all the rest as a second frame.
"""

from __future__ import annotations

import asyncio
import struct

__all__ = ["MAX_FRAME", "PLUGIN_SERVICE_CONN", "RUNTIME_SERVICE_CONN", "Mux", "MuxError"]

HEADER = struct.Struct(">II")
FIRST_FRAME = 4096
MAX_FRAME = 16 * 1024 * 1024  # far above any NRI message; larger is a broken peer
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2


class MuxError(Exception):
    """The byte stream cannot be a multiplexed NRI connection (e.g. an absurd frame)."""


class Mux:
    """Splits one stream into per-conn StreamReaders and frames what each conn writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, asyncio.StreamReader] = {}
        self.dropped_frames = 0

    def open(self, conn_id: int) -> asyncio.StreamReader:
        """The reader side of one logical connection (its writes go through `send`)."""
        if conn_id == 0:
            raise ValueError("conn id 0 is reserved")
        reader = asyncio.StreamReader(limit=MAX_FRAME)
        self._conns[conn_id] = reader
        return reader

    def send(self, conn_id: int, message: bytes) -> None:
        """Queue one whole ttrpc message on `conn_id`, framed as the runtime expects."""
        if len(message) <= FIRST_FRAME:
            self._writer.write(HEADER.pack(conn_id, len(message)) + message)
            return
        head, rest = message[:FIRST_FRAME], message[FIRST_FRAME:]
        self._writer.write(
            HEADER.pack(conn_id, len(head)) + head + HEADER.pack(conn_id, len(rest)) + rest
        )

    async def drain(self) -> None:
        await self._writer.drain()

    async def run(self) -> None:
        """Read frames until EOF, feeding each conn; then end every conn's stream."""
        try:
            while True:
                try:
                    header = await self._reader.readexactly(HEADER.size)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        raise MuxError("connection closed inside a frame header") from e
                    return
                conn_id, length = HEADER.unpack(header)
                if length > MAX_FRAME:
                    raise MuxError(f"frame of {length} bytes on conn {conn_id} exceeds the limit")
                try:
                    payload = await self._reader.readexactly(length)
                except asyncio.IncompleteReadError as e:
                    raise MuxError("connection closed inside a frame") from e
                conn = self._conns.get(conn_id)
                if conn is None:
                    self.dropped_frames += 1
                    continue
                conn.feed_data(payload)
        finally:
            for conn in self._conns.values():
                conn.feed_eof()

    def close(self) -> None:
        self._writer.close()
