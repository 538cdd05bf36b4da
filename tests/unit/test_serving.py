"""BoundedServer: a connection flood never gets more than the cap, and idle ones are closed."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from hcsd.daemon.serving import BoundedServer


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    writer.write(b"ok\n")
    await writer.drain()


async def ask(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello\n")
    try:
        return await reader.readline()
    finally:
        writer.close()


async def test_a_flood_holds_at_most_the_cap_and_idle_ones_are_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = BoundedServer(answer, "127.0.0.1", 0, name="test", max_connections=4, idle_timeout=0.5)
    await server.start()
    flood = []
    try:
        for _ in range(50):  # silent clients: they send nothing, read nothing
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))
            flood.append(s)
        await asyncio.sleep(0.2)
        assert server.open_connections == 4 and server.most_connections == 4
        assert server.saturated >= 1
        assert "test: 4 connections open, the most allowed; new ones wait" in caplog.text
        started = time.monotonic()
        await asyncio.sleep(0.6)  # the first four timed out; four more took their places
        assert server.most_connections == 4
        for s in flood:
            s.close()
        assert await asyncio.wait_for(ask(server.port), 5) == b"ok\n"
        assert time.monotonic() - started < 5
    finally:
        for s in flood:
            s.close()
        await server.stop()
    assert server.open_connections == 0


async def test_a_busy_port_is_an_error_at_start() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = BoundedServer(
            answer, "127.0.0.1", port, name="test", max_connections=4, idle_timeout=1
        )
        with pytest.raises(OSError, match="Address already in use"):
            await server.start()
