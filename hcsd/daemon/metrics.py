"""Prometheus text metrics over a tiny HTTP endpoint (GET /metrics).

Rendered on each scrape from the service's live state, so there is no second copy of the
numbers to keep in step. The HTTP side answers only GET /metrics and /healthz, reads at most a
few KiB of request head, and closes: it binds to loopback by default and needs nothing more.

Any local user can connect, so the port is served by `BoundedServer` (hcsd/daemon/serving.py):
at most `max_connections` open at once, the rest waiting in the kernel's accept queue, and each
closed once `idle_timeout` seconds have passed, whatever it is doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from hcsd import __version__
from hcsd.daemon.serving import BoundedServer
from hcsd.health.watching import HealthWatcher
from hcsd.refusals import Reason
from hcsd.sections import Section, checks, setting
from hcsd.service import NodeService
from hcsd.watchdog import Watchdog
from hcsd.watchdog.metric_families import families

__all__ = ["MetricsSection", "MetricsServer", "render_metrics"]

log = logging.getLogger(__name__)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    inner = ",".join(f'{k}="{escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _value(value: float) -> str:
    """Exact integers (byte counts exceed float's %g precision), shortest repr otherwise."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render_metrics(
    service: NodeService,
    watcher: HealthWatcher | None = None,
    vram: Watchdog | None = None,
) -> str:
    out: list[str] = []

    def family(name: str, kind: str, doc: str, samples: Iterable[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {doc}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {_value(value)}" for labels, value in samples)

    devices = service.devices()
    per_device = [
        (
            _labels(
                [
                    ("device", s.device.uuid),
                    ("vendor", s.device.vendor.value),
                    ("model", s.device.model),
                    ("index", str(s.device.index)),
                ]
            ),
            s,
        )
        for s in devices
    ]
    family("hcs_build_info", "gauge", "hcsd version.", [(_labels([("version", __version__)]), 1)])
    family(
        "hcs_device_vram_capacity_bytes",
        "gauge",
        "Device memory of each device.",
        [(lb, s.device.vram_bytes) for lb, s in per_device],
    )
    family(
        "hcs_device_vram_allocated_bytes",
        "gauge",
        "Device memory held by allocations.",
        [(lb, s.vram_allocated) for lb, s in per_device],
    )
    family(
        "hcs_device_compute_allocated_percent",
        "gauge",
        "Compute share reserved by allocations.",
        [(lb, s.compute_allocated) for lb, s in per_device],
    )
    family(
        "hcs_device_allocations",
        "gauge",
        "Allocations holding each device.",
        [(lb, s.allocations) for lb, s in per_device],
    )
    family(
        "hcs_device_health_score",
        "gauge",
        "Health score 0-100 (100 is healthy).",
        [(lb, s.device.health_score) for lb, s in per_device],
    )
    family(
        "hcs_device_health_state",
        "gauge",
        "1 for the device's current health state.",
        [
            (_labels([("device", s.device.uuid), ("state", s.device.health_state.value)]), 1)
            for s in devices
        ],
    )
    family(
        "hcs_allocations",
        "gauge",
        "Containers holding device slices on this node.",
        [("", len(service.allocations()))],
    )
    family(
        "hcs_orphaned_allocations",
        "gauge",
        "Allocations on devices this node no longer has.",
        [("", len(service.orphans()))],
    )
    reasons = {reason.value: 0 for reason in Reason} | {
        reason.value: n for reason, n in service.refusal_counts().items()
    }
    family(
        "hcs_refusals_total",
        "counter",
        "Requests refused, by reason.",
        [(_labels([("reason", r)]), n) for r, n in sorted(reasons.items())],
    )
    family(
        "hcs_uninjected_containers_total",
        "counter",
        "Containers that asked for devices found running without hcsd's devices and quota.",
        [("", service.uninjected_count)],
    )
    family(
        "hcs_ledger_seq",
        "counter",
        "Operations recorded in the ledger.",
        [("", service.seq)],
    )
    family("hcs_watchers", "gauge", "Clients watching the API.", [("", service.watcher_count)])
    on_bad_devices = [
        a
        for a in service.allocations()
        if any(
            not s.device.health_state.schedulable
            for s in devices
            if s.device.uuid in a.device_uuids
        )
    ]
    family(
        "hcs_allocations_on_unschedulable_devices",
        "gauge",
        "Containers holding an unhealthy or lost device (the cluster side should act).",
        [("", len(on_bad_devices))],
    )
    family(
        "hcs_health_source",
        "gauge",
        "1 for the active health event source.",
        [(_labels([("source", service.health_source)]), 1)],
    )
    if watcher is not None:
        family(
            "hcs_health_events_total",
            "counter",
            "Kernel health events by vendor, code and severity.",
            [
                (_labels([("vendor", v), ("code", c), ("severity", s)]), n)
                for (v, c, s), n in sorted(watcher.events.items())
            ],
        )
        family(
            "hcs_health_source_lines_total",
            "counter",
            "Kernel lines seen, matched and dropped by the health source.",
            [(_labels([("stage", k)]), n) for k, n in sorted(watcher.stats().items())],
        )
    for vram_family in families(vram) if vram is not None else ():
        family(
            vram_family.name,
            vram_family.kind,
            vram_family.doc,
            [(_labels(labels), value) for labels, value in vram_family.samples],
        )
    return "\n".join(out) + "\n"


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


class MetricsServer:
    def __init__(
        self,
        service: NodeService,
        settings: MetricsSection,
        watcher: HealthWatcher | None = None,
        vram: Watchdog | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.service = service
        self.watcher = watcher
        self.vram = vram
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            if len(parts) != 3 or parts[0] != "GET":
                await _respond(writer, 405, "text/plain", "only GET is served\n")
            elif parts[1].split("?")[0] == "/metrics":
                body = render_metrics(self.service, self.watcher, self.vram)
                await _respond(writer, 200, "text/plain; version=0.0.4; charset=utf-8", body)
            elif parts[1] == "/healthz":
                await _respond(writer, 200, "text/plain", "ok\n")
            else:
                await _respond(writer, 404, "text/plain", "try /metrics\n")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _respond(writer: asyncio.StreamWriter, status: int, kind: str, body: str) -> None:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
    data = body.encode()
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
