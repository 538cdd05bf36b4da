"""The vendor-counter fallback: discovery backends' fault counters turned into events."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryBackend, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.sources.counters import CounterPoller
from hcsd.health.watching import HealthWatcher, wanted
from hcsd.model import HealthState
from tests.harness.local import local_node

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


async def test_increases_become_events_classified_by_name(tmp_path: Path) -> None:
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    poller = CounterPoller([SimulatedBackend(node)], {"gpu-a": "0000:17:00.0"}.get, interval=5.0)
    got: list[HealthEvent] = []
    await poller.poll(got.append)
    assert got == []  # first poll: baseline only
    write(node, 3, 0)
    await poller.poll(got.append)
    write(node, 1, 1)  # a reset moved ecc_correctable down: baseline, not an event
    await poller.poll(got.append)
    poller.close()
    assert [(e.code, e.severity, e.bus_id) for e in got] == [
        ("ecc_correctable", Severity.CORRECTABLE, "0000:17:00.0"),
        ("ecc_uncorrectable", Severity.FATAL, "0000:17:00.0"),
    ]
    assert got[0].message == "ecc_correctable rose from 0 to 3"


async def test_a_failing_backend_is_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(DiscoveryBackend):
        name = "broken"

        def discover(self) -> list[object]:  # type: ignore[override]
            return []

        def health_counters(self) -> dict[str, dict[str, int]]:
            raise OSError("library went away")

    poller = CounterPoller([Broken()], lambda uuid: None, interval=5.0)
    await poller.poll(lambda event: None)
    poller.close()
    assert "health: broken counters unavailable: library went away" in caplog.text


async def test_readings_come_with_the_counters_and_never_stale() -> None:
    class Flaky(DiscoveryBackend):
        name = "flaky"
        broken = False

        def discover(self) -> list[object]:  # type: ignore[override]
            return []

        def health_gauges(self) -> dict[str, dict[str, int]]:
            if self.broken:
                raise OSError("library went away")
            return {"gpu-a": {"clock_event_reasons": 0x8}}

    backend = Flaky()
    poller = CounterPoller([backend], lambda uuid: None, interval=5.0)
    await poller.poll(lambda event: None)
    assert poller.gauges == {"gpu-a": {"clock_event_reasons": 0x8}}
    backend.broken = True
    await poller.poll(lambda event: None)
    poller.close()
    assert poller.gauges == {}  # a backend that did not answer has no readings


async def test_failing_readings_keep_the_counters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The readings call failing must not drop the counters (fatal ECC detection)."""

    class NoReadings(SimulatedBackend):
        def health_gauges(self) -> dict[str, dict[str, int]]:
            raise OSError("readings went away")

    node = tmp_path / "node.toml"
    write(node, 0, 0)
    poller = CounterPoller([NoReadings(node)], {"gpu-a": "0000:17:00.0"}.get, interval=5.0)
    got: list[HealthEvent] = []
    await poller.poll(got.append)
    write(node, 0, 1)
    await poller.poll(got.append)
    poller.close()
    assert [(e.code, e.severity) for e in got] == [("ecc_uncorrectable", Severity.FATAL)]
    assert "health: simulated readings unavailable: readings went away" in caplog.text


async def test_watcher_marks_the_device_unhealthy_from_counters(tmp_path: Path) -> None:
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    backend = SimulatedBackend(node)
    local = local_node(tmp_path, discover_all("n", [backend]))
    service = local.service
    watcher = HealthWatcher(
        service, HealthSection(source="off"), backends=[backend], sysfs=str(tmp_path)
    )
    assert watcher.counters is not None
    await watcher.counters.poll(watcher.on_event)
    write(node, 0, 2)
    await watcher.counters.poll(watcher.on_event)
    watcher.counters.close()
    device = service.device("gpu-a")
    assert device is not None and device.health_state is HealthState.UNHEALTHY
    assert watcher.events[("simulated", "ecc_uncorrectable", "fatal")] == 1
    local.close()


class Hanging(DiscoveryBackend):
    """A vendor library stuck in a call (a dying device) until `release` is set."""

    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def discover(self) -> list[object]:  # type: ignore[override]
        return []

    def health_counters(self) -> dict[str, dict[str, int]]:
        self.calls += 1
        self.release.wait(timeout=30)
        return {"gpu-a": {"ecc_uncorrectable": 99}}


async def test_a_hung_vendor_call_is_skipped_and_the_other_backends_still_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    hanging = Hanging()
    poller = CounterPoller(
        [hanging, SimulatedBackend(node)],
        {"gpu-a": "0000:17:00.0"}.get,
        interval=5.0,
        timeout=0.2,
    )
    got: list[HealthEvent] = []
    try:
        started = time.monotonic()
        await poller.poll(got.append)
        assert time.monotonic() - started < 1.0
        assert "health: hanging counters did not answer within 0.2s; skipping" in caplog.text
        write(node, 0, 1)
        await poller.poll(got.append)  # the simulated backend still counts
        assert [(e.vendor, e.code) for e in got] == [("simulated", "ecc_uncorrectable")]
        assert hanging.calls == 1 and poller.timeouts == 1  # skipped, not called again
        hanging.release.set()
        # the pool thread wakes, returns, and the loop marks the call done: then a poll sees it
        deadline = time.monotonic() + 10
        while True:
            await poller.poll(got.append)
            if "came back within" in caplog.text or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert "health: hanging counters call came back within" in caplog.text
        assert hanging.calls == 2  # polled afresh; the stale result was dropped
    finally:
        hanging.release.set()
        poller.close()


async def test_a_hung_vendor_call_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """The watcher's own loop polls a library that hangs for 2 s: other tasks keep running."""
    node = tmp_path / "node.toml"
    write(node, 0, 0)
    hanging = Hanging()
    local = local_node(tmp_path, discover_all("n", [SimulatedBackend(node)]))
    service = local.service
    watcher = HealthWatcher(
        service,
        HealthSection(source="off", tick_interval=0.05),
        backends=[hanging],
        sysfs=str(tmp_path),
    )
    watcher.start(asyncio.get_running_loop())
    timer = threading.Timer(2.0, hanging.release.set)
    timer.start()
    running = asyncio.create_task(watcher.run())
    worst = 0.0
    try:
        for _ in range(50):  # 2.5 s of 50 ms heartbeats
            before = time.monotonic()
            await asyncio.sleep(0.05)
            worst = max(worst, time.monotonic() - before - 0.05)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        timer.cancel()
        hanging.release.set()
        local.close()
    assert hanging.calls >= 1
    assert worst < 0.5, f"the event loop stalled for {worst:.2f}s"


@pytest.mark.parametrize(
    ("source", "subhealth", "watched"),
    [
        pytest.param("auto", False, True, id="kernel-events"),
        pytest.param("off", True, True, id="source-off-sub-health-on"),
        pytest.param("off", False, False, id="all-off"),
    ],
)
def test_source_off_keeps_sub_health_and_the_counters(
    source: str, subhealth: bool, watched: bool
) -> None:
    assert wanted(HealthSection(source=source, subhealth=subhealth)) is watched
