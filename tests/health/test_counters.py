"""The vendor-counter fallback: discovery backends' fault counters turned into events."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryBackend, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.sources.counters import CounterPoller
from hcsd.health.watching import HealthWatcher
from hcsd.ledger import Ledger
from hcsd.model import HealthState
from hcsd.service import NodeService

NODE = """
[[device]]
uuid = "gpu-a"
vendor = "nvidia"
model = "A100-SXM4-80GB"
index = 0
pci_bus_id = "0000:17:00.0"
vram = "80Gi"
counters = {{ ecc_correctable = {cor}, ecc_uncorrectable = {unc}, fan_speed = 100 }}
"""


def write(path: Path, cor: int, unc: int) -> None:
    path.write_text(NODE.format(cor=cor, unc=unc))


def test_increases_become_events_classified_by_name(tmp_path: Path) -> None:
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    poller = CounterPoller([SimulatedBackend(node)], {"gpu-a": "0000:17:00.0"}.get, interval=5.0)
    got: list[HealthEvent] = []
    poller.poll(got.append)
    assert got == []  # first poll: baseline only
    write(node, 3, 0)
    poller.poll(got.append)
    write(node, 1, 1)  # a reset moved ecc_correctable down: baseline, not an event
    poller.poll(got.append)
    assert [(e.code, e.severity, e.bus_id) for e in got] == [
        ("ecc_correctable", Severity.CORRECTABLE, "0000:17:00.0"),
        ("ecc_uncorrectable", Severity.FATAL, "0000:17:00.0"),
    ]
    assert got[0].message == "ecc_correctable rose from 0 to 3"


def test_a_failing_backend_is_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(DiscoveryBackend):
        name = "broken"

        def discover(self) -> list[object]:  # type: ignore[override]
            return []

        def health_counters(self) -> dict[str, dict[str, int]]:
            raise OSError("library went away")

    poller = CounterPoller([Broken()], lambda uuid: None, interval=5.0)
    poller.poll(lambda event: None)
    assert "health: broken counters unavailable: library went away" in caplog.text


def test_watcher_marks_the_device_unhealthy_from_counters(tmp_path: Path) -> None:
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    backend = SimulatedBackend(node)
    ledger = Ledger(str(tmp_path / "state"))
    ledger.open()
    service = NodeService(discover_all("n", [backend]), ledger)
    watcher = HealthWatcher(
        service, HealthSection(source="off"), backends=[backend], sysfs=str(tmp_path)
    )
    assert watcher.counters is not None
    watcher.counters.poll(watcher.on_event)
    write(node, 0, 2)
    watcher.counters.poll(watcher.on_event)
    device = service.device("gpu-a")
    assert device is not None and device.health_state is HealthState.UNHEALTHY
    assert watcher.events[("simulated", "ecc_uncorrectable", "fatal")] == 1
    ledger.close()
