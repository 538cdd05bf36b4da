"""ttrpc, the runtime's small RPC protocol: server and client over one byte stream each.

Message: 10-byte header `u32 data length | u32 stream id | u8 type | u8 flags` (big-endian),
then the data. Type 1 request (a `Request` envelope), 2 response (a `Response`). Client stream
ids are odd, increasing, never reused; a response carries its request's id. Status codes are
gRPC's. Requests are handled concurrently and each reply is sent whole, so a slow handler never
holds up a Configure that the runtime sends while our RegisterPlugin is still open.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable

from google.protobuf.message import DecodeError

from hcsd.runtime.nri import ttrpc_pb2 as wire

__all__ = ["MAX_DATA", "Client", "Code", "Server", "TtrpcError", "read_message"]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
MAX_DATA = 4 * 1024 * 1024
TYPE_REQUEST = 1
TYPE_RESPONSE = 2

Send = Callable[[bytes], None]
Handler = Callable[[bytes], Awaitable[bytes]]


class Code(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class TtrpcError(Exception):
    """A non-OK status, raised by handlers to refuse and by the client on a failed call."""

    def __init__(self, code: Code | int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message


def encode(stream_id: int, kind: int, data: bytes) -> bytes:
    return HEADER.pack(len(data), stream_id, kind, 0) + data


async def read_message(reader: asyncio.StreamReader) -> tuple[int, int, bytes] | None:
    """(stream id, type, data), or None at a clean end of stream.

    An oversized message is read and thrown away so the stream stays in step; the caller gets
    it with empty data and the length in the type slot's place via TtrpcError.
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise TtrpcError(Code.INTERNAL, "stream ended inside a message header") from e
        return None
    length, stream_id, kind, _flags = HEADER.unpack(header)
    if length > MAX_DATA:
        remaining = length
        while remaining:
            chunk = await reader.read(min(remaining, 65536))
            if not chunk:
                raise TtrpcError(Code.INTERNAL, "stream ended inside an oversized message")
            remaining -= len(chunk)
        raise _Oversized(stream_id, length)
    try:
        data = await reader.readexactly(length)
    except asyncio.IncompleteReadError as e:
        raise TtrpcError(Code.INTERNAL, "stream ended inside a message") from e
    return stream_id, kind, data


class _Oversized(TtrpcError):
    def __init__(self, stream_id: int, length: int) -> None:
        super().__init__(Code.RESOURCE_EXHAUSTED, f"message of {length} bytes exceeds {MAX_DATA}")
        self.stream_id = stream_id


class Server:
    """Serves one ttrpc connection; handlers are keyed by (service, method)."""

    def __init__(self, handlers: dict[tuple[str, str], Handler], send: Send) -> None:
        self.handlers = handlers
        self._send = send
        self._last_stream = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    message = await read_message(reader)
                except _Oversized as e:
                    self._reply(e.stream_id, e.code, e.message, b"")
                    continue
                if message is None:
                    return
                stream_id, kind, data = message
                if kind != TYPE_REQUEST:
                    continue  # data frames of streaming calls: hcsd serves only unary methods
                if stream_id % 2 == 0 or stream_id <= self._last_stream:
                    self._reply(
                        stream_id, Code.INVALID_ARGUMENT, f"invalid stream id {stream_id}", b""
                    )
                    continue
                self._last_stream = stream_id
                task = asyncio.create_task(self._handle(stream_id, data), name=f"ttrpc-{stream_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in self._tasks:
                task.cancel()

    async def _handle(self, stream_id: int, data: bytes) -> None:
        try:
            request = wire.Request.FromString(data)
        except DecodeError as e:
            self._reply(stream_id, Code.INVALID_ARGUMENT, f"malformed request: {e}", b"")
            return
        handler = self.handlers.get((request.service, request.method))
        if handler is None:
            known = {service for service, _ in self.handlers}
            what = (
                f"method {request.method}"
                if request.service in known
                else f"service {request.service}"
            )
            self._reply(stream_id, Code.UNIMPLEMENTED, what, b"")
            return
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        try:
            payload = await asyncio.wait_for(handler(request.payload), timeout)
        except TtrpcError as e:
            self._reply(stream_id, e.code, e.message, b"")
        except TimeoutError:
            self._reply(
                stream_id,
                Code.DEADLINE_EXCEEDED,
                f"{request.method} did not finish within {timeout}s",
                b"",
            )
        except DecodeError as e:
            self._reply(
                stream_id, Code.INVALID_ARGUMENT, f"malformed {request.method} payload: {e}", b""
            )
        except Exception as e:
            log.exception("ttrpc: %s failed", request.method)
            self._reply(stream_id, Code.INTERNAL, f"{request.method} failed: {e}", b"")
        else:
            self._reply(stream_id, Code.OK, "", payload)

    def _reply(self, stream_id: int, code: int, message: str, payload: bytes) -> None:
        response = wire.Response(payload=payload)
        if code != Code.OK:
            response.status.code = code
            response.status.message = message
        self._send(encode(stream_id, TYPE_RESPONSE, response.SerializeToString()))


class Client:
    """Calls methods over one ttrpc connection; several calls may be in flight."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._closed: Exception | None = None

    async def receive(self, reader: asyncio.StreamReader) -> None:
        """Route responses to their calls until the stream ends; then fail what is pending."""
        try:
            while True:
                message = await read_message(reader)
                if message is None:
                    break
                stream_id, kind, data = message
                future = self._pending.pop(stream_id, None)
                if kind != TYPE_RESPONSE or future is None or future.done():
                    continue
                try:
                    response = wire.Response.FromString(data)
                except DecodeError as e:
                    future.set_exception(TtrpcError(Code.INTERNAL, f"malformed response: {e}"))
                    continue
                if response.status.code != Code.OK:
                    future.set_exception(TtrpcError(response.status.code, response.status.message))
                else:
                    future.set_result(response.payload)
        finally:
            self._closed = ConnectionError("ttrpc connection closed")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(self._closed)
            self._pending.clear()

    async def call(self, service: str, method: str, payload: bytes, *, timeout: float) -> bytes:
        if self._closed is not None:
            raise self._closed
        stream_id = self._next_stream
        self._next_stream += 2
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        request = wire.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9)
        )
        self._send(encode(stream_id, TYPE_REQUEST, request.SerializeToString()))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(stream_id, None)
