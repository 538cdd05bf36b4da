"""Prometheus metrics over a tiny HTTP endpoint (GET /metrics).

Collected on each scrape from the service's live state (`NodeCollector`), so there is no second
copy of the numbers to keep in step; `prometheus_client` renders them (escaping, OpenMetrics when
the scraper's Accept header asks for it), and this module serves them itself rather than
through the library's own server, to keep the connection limits below. The HTTP side answers
only GET /metrics and /healthz, reads at most a few KiB of request head, and closes: it binds
to loopback by default and needs nothing more.

Any local user can connect, so the port is served by `BoundedServer` (hcsd/daemon/serving.py):
at most `max_connections` open at once, the rest waiting in the kernel's accept queue, and each
closed once `idle_timeout` seconds have passed, whatever it is doing. Rendering runs on the
event loop the NRI hooks share (a few milliseconds a scrape), so a body is kept for
`cache_seconds` per content type: a local loop of GETs costs the loop one render a second,
not one a request, and Prometheus (every 15 s or more) always gets a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder

from hcsd.daemon.node_metrics import NodeCollector
from hcsd.daemon.serving import BoundedServer
from hcsd.health.watching import HealthWatcher
from hcsd.sections import Section, checks, setting
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry
from hcsd.watchdog import Watchdog

__all__ = ["MetricsSection", "MetricsServer", "exposition", "registry", "render_metrics"]

log = logging.getLogger(__name__)


def registry(
    service: NodeService,
    watcher: HealthWatcher | None = None,
    vram: Watchdog | None = None,
    telemetry: Telemetry | None = None,
) -> CollectorRegistry:
    """Everything /metrics exports: the node's families, the parts' timings, and the process
    (start time, memory, descriptors) and Python runtime collectors."""
    found = CollectorRegistry()
    found.register(NodeCollector(service, watcher, vram))
    if telemetry is not None:
        found.register(telemetry)
    ProcessCollector(registry=found)
    PlatformCollector(registry=found)
    GCCollector(registry=found)
    return found


def exposition(found: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The body and its Content-Type: OpenMetrics when the scraper asks for it (Prometheus
    does), the classic text format otherwise."""
    encoder, content_type = choose_encoder(accept)
    return encoder(found), content_type


def render_metrics(
    service: NodeService,
    watcher: HealthWatcher | None = None,
    vram: Watchdog | None = None,
) -> str:
    """The classic text format, as one string (tests, benchmarks)."""
    return generate_latest(registry(service, watcher, vram)).decode()


@dataclass(frozen=True, slots=True)
class MetricsSection(Section):
    """`[metrics]`: where the Prometheus endpoint listens."""

    listen: str = setting(
        "127.0.0.1:9400",
        "Prometheus text endpoint (GET /metrics) as HOST:PORT; empty disables it.",
        checks.listen,
    )


MAX_CONNECTIONS = 16  # Prometheus scrapes one at a time; a few spare for curl and probes
IDLE_TIMEOUT = 5.0
MAX_HEAD = 8192
CACHE_SECONDS = 1.0


class MetricsServer:
    def __init__(
        self,
        service: NodeService,
        settings: MetricsSection,
        watcher: HealthWatcher | None = None,
        vram: Watchdog | None = None,
        telemetry: Telemetry | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry(service, watcher, vram, telemetry)
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._cache: dict[str, tuple[float, bytes]] = {}  # content type -> (rendered at, body)
        self.renders = 0
        host, _, port = settings.listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.server = BoundedServer(
            self._serve,
            self.host,
            self.port,
            name="metrics",
            max_connections=max_connections,
            idle_timeout=idle_timeout,
            limit=MAX_HEAD,
        )

    async def start(self) -> None:
        await self.server.start()
        self.port = self.server.port
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop()

    def body(self, accept: str) -> tuple[bytes, str]:
        """The rendered body for `accept`, rendered again once `cache_seconds` have passed."""
        encoder, kind = choose_encoder(accept)
        now = self.clock()
        cached = self._cache.get(kind)
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1], kind
        body = encoder(self.registry)
        self.renders += 1
        self._cache[kind] = (now, body)
        return body, kind

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            parts = head[0].split()
            if len(parts) != 3 or parts[0] != "GET":
                await _respond(writer, 405, "text/plain", b"only GET is served\n")
            elif parts[1].split("?")[0] == "/metrics":
                body, kind = self.body(_header(head[1:], "accept"))
                await _respond(writer, 200, kind, body)
            elif parts[1] == "/healthz":
                await _respond(writer, 200, "text/plain", b"ok\n")
            else:
                await _respond(writer, 404, "text/plain", b"try /metrics\n")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _header(lines: list[str], name: str) -> str:
    """The value of header `name` (lower case), empty when absent."""
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return ""


async def _respond(writer: asyncio.StreamWriter, status: int, kind: str, data: bytes) -> None:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
