"""Mux framing and ttrpc semantics over a real socketpair."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from hcsd.runtime.nri import ttrpc_pb2 as wire
from hcsd.runtime.nri.mux import Mux, MuxError
from hcsd.runtime.nri.ttrpc import MAX_DATA, Client, Code, Server, TtrpcError, encode


async def pair() -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], socket.socket]:
    ours, theirs = socket.socketpair()
    streams = await asyncio.open_unix_connection(sock=ours)
    theirs.setblocking(False)
    return streams, theirs


async def read_frames(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    loop = asyncio.get_running_loop()
    buffer = b""
    frames = []
    while len(frames) < count:
        buffer += await loop.sock_recv(sock, 65536)
        while len(buffer) >= 8:
            conn, length = struct.unpack(">II", buffer[:8])
            if len(buffer) < 8 + length:
                break
            frames.append((conn, buffer[8 : 8 + length]))
            buffer = buffer[8 + length :]
    return frames


@pytest.mark.parametrize(
    ("size", "frames"), [(10, [10]), (4096, [4096]), (5000, [4096, 904]), (100_000, [4096, 95_904])]
)
async def test_framing_rule(size: int, frames: list[int]) -> None:
    (reader, writer), peer = await pair()
    mux = Mux(reader, writer)
    mux.send(2, b"x" * size)
    await mux.drain()
    got = await read_frames(peer, len(frames))
    assert [len(p) for _, p in got] == frames and {c for c, _ in got} == {2}
    writer.close()
    peer.close()


async def test_frames_are_split_per_conn_and_unknown_conns_dropped() -> None:
    (reader, writer), peer = await pair()
    mux = Mux(reader, writer)
    one = mux.open(1)
    running = asyncio.create_task(mux.run())
    loop = asyncio.get_running_loop()
    payload = struct.pack(">II", 7, 3) + b"zzz" + struct.pack(">II", 1, 5) + b"hello"
    await loop.sock_sendall(peer, payload)
    assert await one.readexactly(5) == b"hello"
    peer.close()
    await running
    assert mux.dropped_frames == 1
    assert await one.read() == b""  # EOF reached the conn


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(struct.pack(">II", 1, 2**31), "exceeds the limit", id="absurd-length"),
        pytest.param(struct.pack(">II", 1, 10) + b"abc", "inside a frame", id="torn-frame"),
        pytest.param(b"\x00\x00\x00", "inside a frame header", id="torn-header"),
    ],
)
async def test_broken_frames(data: bytes, message: str) -> None:
    (reader, writer), peer = await pair()
    mux = Mux(reader, writer)
    mux.open(1)
    await asyncio.get_running_loop().sock_sendall(peer, data)
    peer.close()
    with pytest.raises(MuxError, match=message):
        await mux.run()


_RUNNING: set[asyncio.Task[None]] = set()


async def ttrpc_pair(
    handlers: dict[tuple[str, str], object],
) -> tuple[Client, asyncio.StreamReader, list[bytes]]:
    """A Server fed from a StreamReader, answering into a list the Client reads back."""
    to_server = asyncio.StreamReader()
    to_client = asyncio.StreamReader()
    raw_replies: list[bytes] = []

    def server_send(data: bytes) -> None:
        raw_replies.append(data)
        to_client.feed_data(data)

    server = Server(handlers, server_send)  # type: ignore[arg-type]
    client = Client(to_server.feed_data)
    _RUNNING.add(asyncio.create_task(server.serve(to_server)))
    _RUNNING.add(asyncio.create_task(client.receive(to_client)))
    return client, to_server, raw_replies


async def test_call_and_errors() -> None:
    async def echo(payload: bytes) -> bytes:
        return payload[::-1]

    async def refuse(payload: bytes) -> bytes:
        raise TtrpcError(Code.RESOURCE_EXHAUSTED, "no room")

    async def slow(payload: bytes) -> bytes:
        await asyncio.sleep(1)
        return b""

    client, _, _ = await ttrpc_pair(
        {("svc", "Echo"): echo, ("svc", "Refuse"): refuse, ("svc", "Slow"): slow}
    )
    assert await client.call("svc", "Echo", b"abc", timeout=1) == b"cba"
    calls = await asyncio.gather(
        *(client.call("svc", "Echo", bytes([i]), timeout=1) for i in range(20))
    )
    assert calls == [bytes([i]) for i in range(20)]
    with pytest.raises(TtrpcError) as info:
        await client.call("svc", "Refuse", b"", timeout=1)
    assert (info.value.code, info.value.message) == (Code.RESOURCE_EXHAUSTED, "no room")
    with pytest.raises(TtrpcError) as info:
        await client.call("svc", "Nope", b"", timeout=1)
    assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "method Nope")
    with pytest.raises(TtrpcError) as info:
        await client.call("other", "Echo", b"", timeout=1)
    assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "service other")


async def test_deadline_from_timeout_nano() -> None:
    async def slow(payload: bytes) -> bytes:
        await asyncio.sleep(5)
        return b""

    _, to_server, replies = await ttrpc_pair({("svc", "Slow"): slow})
    request = wire.Request(service="svc", method="Slow", timeout_nano=50_000_000)
    to_server.feed_data(encode(1, 1, request.SerializeToString()))
    await asyncio.sleep(0.2)
    response = wire.Response.FromString(replies[0][10:])
    assert response.status.code == Code.DEADLINE_EXCEEDED
    assert "within 0.05s" in response.status.message


async def test_bad_stream_ids_and_oversized_and_garbage() -> None:
    async def ok(payload: bytes) -> bytes:
        return b"ok"

    _, to_server, replies = await ttrpc_pair({("svc", "Ok"): ok})
    request = wire.Request(service="svc", method="Ok").SerializeToString()
    to_server.feed_data(encode(2, 1, request))  # even id
    to_server.feed_data(encode(5, 1, request))
    to_server.feed_data(encode(3, 1, request))  # not increasing
    to_server.feed_data(encode(7, 1, b"\xff\xff\xff"))  # not a Request
    to_server.feed_data(struct.pack(">IIBB", MAX_DATA + 1, 9, 1, 0) + b"\0" * (MAX_DATA + 1))
    to_server.feed_data(encode(11, 1, request))
    await asyncio.sleep(0.1)
    codes = {}
    for raw in replies:
        _, stream, _, _ = struct.unpack(">IIBB", raw[:10])
        response = wire.Response.FromString(raw[10:])
        codes[stream] = response.status.code
    assert codes == {
        2: Code.INVALID_ARGUMENT,
        5: Code.OK,
        3: Code.INVALID_ARGUMENT,
        7: Code.INVALID_ARGUMENT,
        9: Code.RESOURCE_EXHAUSTED,
        11: Code.OK,
    }


async def test_pending_calls_fail_when_the_stream_ends() -> None:
    to_client = asyncio.StreamReader()
    client = Client(lambda data: None)
    receiving = asyncio.create_task(client.receive(to_client))
    call = asyncio.create_task(client.call("svc", "X", b"", timeout=5))
    await asyncio.sleep(0.01)
    to_client.feed_eof()
    await receiving
    with pytest.raises(ConnectionError):
        await call
