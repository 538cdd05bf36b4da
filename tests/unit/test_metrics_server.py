"""hcsd's /metrics over HTTP: a loop of GETs does not render once a request on the event loop
the NRI hooks share; a body is kept for a second per content type."""

from __future__ import annotations

import asyncio

from hcsd.daemon.metrics import MetricsSection, MetricsServer
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import Request
from hcsd.service import NodeService
from tests.conftest import GiB
from tests.harness.daemon import free_port

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


async def get(port: int, accept: str = "") -> tuple[str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    kind = next(line for line in head.decode().split("\r\n") if line.startswith("Content-Type"))
    return kind, body


async def test_a_loop_of_gets_renders_once_a_second_per_content_type(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    service = NodeService(mixed_inventory, ledger)
    now = [100.0]
    section = MetricsSection(listen=f"127.0.0.1:{free_port()}")
    server = MetricsServer(service, section, clock=lambda: now[0])
    await server.start()
    try:
        _, first = await get(server.port)
        service.allocate(Request("c1", vram_bytes=GiB))
        for _ in range(20):
            assert (await get(server.port))[1] == first  # the same body, not rendered again
        assert server.renders == 1
        kind, om = await get(server.port, OPENMETRICS)  # its own body, not the text one
        assert "openmetrics" in kind and om.endswith(b"# EOF\n") and server.renders == 2
        now[0] += 1.0
        _, fresh = await get(server.port)
        assert server.renders == 3
        assert b"hcs_allocations 1.0" in fresh and b"hcs_allocations 0.0" in first
    finally:
        await server.stop()
