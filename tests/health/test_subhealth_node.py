"""Sub-health on a whole node: the NVIDIA backend over the fake libnvidia-ml (real pynvml
calls), a fake sysfs, the health watcher with a short hold and a controlled clock; the verdict
as hcsctl, the ComputeNode and the metrics read it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hcsd.api.messages import device_to_pb
from hcsd.cluster.objects import node_status
from hcsd.daemon.metrics import exposition, registry
from hcsd.discovery import discover_all
from hcsd.discovery.backends.nvidia import NvidiaBackend
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.watching import HealthWatcher
from hcsd.model import Device, HealthState
from hcsd.telemetry import Telemetry
from tests.fakes.nodes import FakeNode, nvidia_node
from tests.harness.local import LocalNode, local_node
from tests.unit.test_node_metrics import samples

HOLD, RECOVERY, POLL = 30.0, 20.0, 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def line_of(kind: str, pairs: dict[str, str]) -> str:
    """A record as tests/fakes.write_config writes it."""
    words = [f'{k}="{v}"' if " " in v else f"{k}={v}" for k, v in pairs.items()]
    return " ".join([kind, *words])


class Node:
    """Three fake A100s and what watches them; `set` changes the fake driver's readings."""

    def __init__(
        self,
        fake: FakeNode,
        local: LocalNode,
        watcher: HealthWatcher,
        clock: Clock,
        backend: NvidiaBackend,
    ):
        self.fake, self.local, self.watcher, self.clock = fake, local, watcher, clock
        self.backend = backend
        self.uuids = [s.device.uuid for s in local.service.devices()]

    def set(self, index: int, **values: object) -> None:
        """Rewrite device `index`'s record with `values` (the fake re-reads a changed file)."""
        lines = self.fake.config.read_text().splitlines()
        uuid = f"uuid={self.uuids[index]}"
        for position, line in enumerate(lines):
            if uuid in line:
                pairs = dict(p.split("=", 1) for p in shlex.split(line)[1:])
                pairs.update({k: str(v) for k, v in values.items()})
                lines[position] = line_of("device", pairs)
        self.fake.config.write_text("\n".join(lines) + "\n")
        stat = self.fake.config.stat()
        os.utime(self.fake.config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    def link(self, index: int, width: int) -> None:
        bus = self.device(index).pci_bus_id
        (self.fake.sysfs / "bus" / "pci" / "devices" / bus / "current_link_width").write_text(
            f"{width}\n"
        )

    async def poll(self, seconds: float = POLL) -> None:
        """The watcher's poll every 5 s for `seconds`: counters, readings, sub-health, and the
        analyzer's tick (its recovery with time)."""
        for _ in range(int(seconds // POLL)):
            self.clock.now += POLL
            assert self.watcher.counters is not None
            await self.watcher.counters.poll(self.watcher.on_event)
            self.watcher.check_subhealth()
            self.watcher.tick()

    def device(self, index: int) -> Device:
        device = self.local.service.device(self.uuids[index])
        assert device is not None
        return device

    def state(self, index: int) -> HealthState:
        return self.device(index).health_state


@pytest.fixture
def settings() -> HealthSection:
    return HealthSection(
        source="off", subhealth_hold=HOLD, subhealth_recovery=RECOVERY, quiet_period=60.0
    )


@pytest.fixture
def node(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch, settings: HealthSection
) -> Iterator[Node]:
    try:
        fake = nvidia_node(tmp_path, count=3, topology="pcie")
    except PermissionError:
        pytest.skip("NOT ROOT: device nodes cannot be created (os.mknod needs CAP_MKNOD)")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fake.config))
    backend = NvidiaBackend(fake.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    local = local_node(tmp_path, discover_all("n", [backend]))
    clock = Clock()
    watcher = HealthWatcher(
        local.service,
        settings,
        clock=clock,
        backends=[backend],
        sysfs=str(fake.sysfs),
        run_dir=str(tmp_path / "run"),
    )
    yield Node(fake, local, watcher, clock, backend)
    assert watcher.counters is not None
    watcher.counters.close()
    backend.close()
    local.close()


async def test_degraded_after_the_hold_with_named_reasons(node: Node) -> None:
    await node.poll()
    node.set(0, clock_reasons=0x8, sm_clock_now=705)  # HW_SLOWDOWN
    node.link(1, 8)  # down-trained to x8
    await node.poll(HOLD)  # first seen on the first of these polls: held 25 s of 30
    assert [node.state(i) for i in range(3)] == [HealthState.HEALTHY] * 3  # not before
    await node.poll()
    assert [node.state(i) for i in range(3)] == [
        HealthState.DEGRADED,
        HealthState.DEGRADED,
        HealthState.HEALTHY,
    ]
    slow, narrow = dict(node.device(0).attributes), dict(node.device(1).attributes)
    assert slow["subhealth"] == "hw-slowdown"
    assert slow["health_cause"] == "hw-slowdown"
    assert slow["health_reason"] == (
        "hw-slowdown: clock event reasons 0x8 (hw-slowdown); SM clock 705 of 1410 MHz"
    )
    assert narrow["subhealth"] == "pcie-link-width"
    assert node.device(0).health_score == 50  # scored down: the extender ranks by it
    assert node.device(2).health_score == 100

    # where the reason travels: the API's device (hcsctl), the ComputeNode, the metrics
    devices = [device_to_pb(s) for s in node.local.service.devices()]
    assert devices[0].attributes["subhealth"] == "hw-slowdown"
    status = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    by_uuid = {d["uuid"]: d for d in status["devices"]}
    assert by_uuid[node.uuids[0]]["health"] == "degraded"
    assert by_uuid[node.uuids[0]]["subhealth"] == ["hw-slowdown"]
    assert by_uuid[node.uuids[1]]["subhealth"] == ["pcie-link-width"]
    assert "subhealth" not in by_uuid[node.uuids[2]]
    body, _ = exposition(registry(node.local.service, node.watcher, telemetry=Telemetry()), "")
    subhealth = {
        (dict(labels)["device"], dict(labels)["reason"])
        for (name, labels), _ in samples(body.decode()).items()
        if name == "hcs_device_subhealth"
    }
    assert subhealth == {(node.uuids[0], "hw-slowdown"), (node.uuids[1], "pcie-link-width")}


async def test_clears_after_the_recovery_time_without_flapping(node: Node) -> None:
    node.set(0, clock_reasons=0x40)  # HW_THERMAL_SLOWDOWN
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.DEGRADED
    node.set(0, clock_reasons=0x0)
    await node.poll(RECOVERY - 2 * POLL)
    node.set(0, clock_reasons=0x40)  # back for one reading: still degraded, recovery restarts
    await node.poll()
    node.set(0, clock_reasons=0x0)
    await node.poll(RECOVERY - POLL)
    assert node.state(0) is HealthState.DEGRADED
    await node.poll()
    assert node.state(0) is HealthState.HEALTHY
    attributes = dict(node.device(0).attributes)
    assert "subhealth" not in attributes and "health_reason" not in attributes
    assert node.device(0).health_score == 100


async def test_unhealthy_wins_over_sub_health(node: Node) -> None:
    node.link(2, 4)
    await node.poll(HOLD + POLL)
    assert node.state(2) is HealthState.DEGRADED
    bus = node.device(2).pci_bus_id
    node.watcher.on_event(
        HealthEvent(bus, "nvidia", "xid-79", Severity.FATAL, "fell off the bus", node.clock())
    )
    assert node.state(2) is HealthState.UNHEALTHY
    await node.poll(HOLD)  # the signal still holds: the device stays unhealthy
    device = node.device(2)
    assert device.health_state is HealthState.UNHEALTHY
    assert dict(device.attributes)["health_cause"] == "xid-79 (fatal)"
    assert dict(device.attributes)["subhealth"] == "pcie-link-width"
    assert device.health_score == 0


async def test_rising_corrections_from_nvml(node: Node) -> None:
    await node.poll()
    for step in range(1, int(HOLD / POLL) + 2):
        node.set(1, ecc_corrected=step * 3)
        await node.poll()
    assert node.state(1) is HealthState.DEGRADED
    assert dict(node.device(1).attributes)["subhealth"] == "ecc-correctable-rising"
    await node.poll(60.0 + RECOVERY)  # the counter stopped: clears after window + recovery
    assert "subhealth" not in dict(node.device(1).attributes)
    assert node.state(1) is HealthState.HEALTHY


async def test_pending_remap_on_a_device_without_clock_reasons(node: Node) -> None:
    node.set(2, remap_pending=1, clock_reasons="unsupported")
    await node.poll(HOLD + POLL)
    assert dict(node.device(2).attributes)["subhealth"] == "row-remap-pending"


async def test_the_running_watcher_checks_sub_health_on_its_poll(node: Node) -> None:
    """The daemon's loop, in real time with a 0.3 s hold: the poll reads the signals."""
    settings = HealthSection(
        source="off", aer_poll_interval=0.05, tick_interval=0.02, subhealth_hold=0.3
    )
    assert node.watcher.counters is not None
    node.watcher.counters.close()
    watcher = HealthWatcher(
        node.local.service, settings, backends=[node.backend], sysfs=str(node.fake.sysfs)
    )
    node.link(0, 8)
    task = asyncio.create_task(watcher.run())
    try:
        started = time.monotonic()
        while node.state(0) is HealthState.HEALTHY and time.monotonic() - started < 10:
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert dict(node.device(0).attributes)["subhealth"] == "pcie-link-width"
    assert 0.3 <= took < 10


async def test_an_idle_gpu_is_not_judged_on_its_width(node: Node) -> None:
    """NVIDIA narrows the link when idle: only a busy GPU's width is judged."""
    node.set(0, util=0)
    node.link(0, 4)
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.HEALTHY
    node.set(0, util=90)
    await node.poll(HOLD + POLL)
    assert dict(node.device(0).attributes)["subhealth"] == "pcie-link-width"


async def test_the_sm_clock_is_judged_only_under_load(node: Node) -> None:
    """An idle GPU's SM clock drops by design: `sm-clock-low` is judged from the readings of
    a poll whose utilization says the GPU works (as during a workload or hcsd's own GEMM);
    the idle polls in between leave it as it was, never clear it."""
    node.set(0, util=0, sm_clock_now=300, clock_reasons=0)  # idle: 300 of 1410 MHz is normal
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.HEALTHY
    node.set(0, util=95)  # working, still at 300 MHz and no reason given
    await node.poll(HOLD + POLL)
    attributes = dict(node.device(0).attributes)
    assert attributes["subhealth"] == "sm-clock-low"
    assert "SM clock 300 of 1410 MHz while busy" in attributes["health_reason"]
    node.set(0, util=0, sm_clock_now=1410)  # idle again: not evidence of recovery
    await node.poll(RECOVERY + POLL)
    assert dict(node.device(0).attributes)["subhealth"] == "sm-clock-low"


async def test_missing_evidence_keeps_a_degraded_device_degraded(node: Node) -> None:
    """Idle, then hung (every NVML call fails): neither is the signal gone."""
    node.link(0, 8)
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.DEGRADED
    node.link(0, 16)
    node.set(0, util=0)  # idle at full width: says nothing of the busy link
    await node.poll(RECOVERY * 3)
    node.set(0, lost=1)  # NVML answers GPU_IS_LOST to everything
    await node.poll(RECOVERY * 3)
    assert node.state(0) is HealthState.DEGRADED
    node.set(0, lost=0, util=90)  # busy at full width: recovers after the recovery time
    await node.poll(RECOVERY + POLL)
    assert node.state(0) is HealthState.HEALTHY


async def test_one_failing_reading_leaves_the_others(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.set(0, util="fail", clock_reasons=0x8)
    await node.poll()
    await node.poll()
    readings = node.backend.health_gauges()[node.uuids[0]]
    assert readings["clock_event_reasons"] == 0x8 and "busy" not in readings
    warned = [r for r in caplog.records if "utilization_percent" in r.getMessage()]
    assert len(warned) == 1  # once per device and reading, not every poll
    await node.poll(HOLD)
    assert dict(node.device(0).attributes)["subhealth"] == "hw-slowdown"


async def test_a_node_wide_brake_degrades_no_device(node: Node) -> None:
    for index in range(3):
        node.set(index, clock_reasons=0x80)  # the chassis's power brake, on every GPU
    node.set(1, clock_reasons=0x88)  # and one GPU with its own slowdown
    await node.poll(HOLD + POLL)
    assert [node.state(i) for i in range(3)] == [
        HealthState.HEALTHY,
        HealthState.DEGRADED,
        HealthState.HEALTHY,
    ]
    assert dict(node.device(1).attributes)["subhealth"] == "hw-slowdown"
    assert {dict(node.device(i).attributes)["subhealth_node"] for i in range(3)} == {
        "hw-power-brake"
    }
    devices = [device_to_pb(s) for s in node.local.service.devices()]
    status = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    assert status["nodeSubhealth"] == ["hw-power-brake"]
    assert status["subhealth"] == f"{node.uuids[1]}: hw-slowdown; node: hw-power-brake"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == f"{node.uuids[1]} degraded: hw-slowdown"
    node.set(0, clock_reasons=0x0)  # one GPU free of it: the others are degraded for it
    await node.poll(RECOVERY + POLL)
    assert [node.state(i) for i in range(3)] == [
        HealthState.HEALTHY,
        HealthState.DEGRADED,
        HealthState.DEGRADED,
    ]
    assert "subhealth_node" not in dict(node.device(0).attributes)


IGNORING = HealthSection(source="off", subhealth_hold=HOLD, subhealth_ignore=("hw-power-brake",))


@pytest.mark.parametrize("settings", [IGNORING])
async def test_ignored_reasons_are_not_tracked(node: Node) -> None:
    node.set(0, clock_reasons=0x80)
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.HEALTHY


async def test_a_restart_keeps_the_holds(node: Node, tmp_path: Path) -> None:
    node.link(0, 8)
    await node.poll(HOLD + POLL)
    assert node.state(0) is HealthState.DEGRADED
    # hcsd restarts: the device record comes back from discovery, healthy, and the clock
    # is a new monotonic one
    device = node.device(0)
    node.local.service.set_device(
        replace(device, health_state=HealthState.HEALTHY, health_score=100, attributes=())
    )
    assert node.watcher.counters is not None
    node.watcher.counters.close()
    node.clock.now = 5.0
    node.watcher = HealthWatcher(
        node.local.service,
        node.watcher.settings,
        clock=node.clock,
        backends=[node.backend],
        sysfs=str(node.fake.sysfs),
        run_dir=str(tmp_path / "run"),
    )
    await node.poll()
    assert node.state(0) is HealthState.DEGRADED  # at once, not a hold time later
    assert dict(node.device(0).attributes)["subhealth"] == "pcie-link-width"
