"""The Cambricon backend over a fake libcndev.so, and its cnmon fallback over recorded output."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryError
from hcsd.discovery.backends.cambricon import CambriconBackend, parse_cnmon
from hcsd.discovery.settings import DiscoverySection
from hcsd.health.events import Severity
from hcsd.health.sources.counters import COUNTER_SEVERITY
from hcsd.model import DeviceNode, HealthState, LinkKind
from tests.fakes import make_devfs
from tests.fakes.nodes import cambricon_node, discover_once, tool

DATA = Path(__file__).parent / "data"
GiB = 2**30


def test_eight_mlus_in_a_ring(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = cambricon_node(tmp_path)
    monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(node.config))
    backend = CambriconBackend(node.section(cndev_library=str(fake_libs / "libcndev.so")))
    try:
        devices = backend.discover()
        counters = backend.health_counters()
    finally:
        backend.close()
    assert len(devices) == 8
    first = devices[0]
    assert first.model == "MLU370-X8"
    assert first.vram_bytes == 48 * GiB
    assert first.tflops_fp16 == 96.0
    assert first.uuid == "MLU-20001012-1916-0000-0000-000000000000"
    assert first.pci_bus_id == "0000:3d:00.0"
    assert first.device_nodes == (
        DeviceNode("/dev/cambricon_dev0", 240, 0),
        DeviceNode("/dev/cambricon_ipcm0", 241, 0),
    )
    assert [n.path for n in first.shared_nodes] == ["/dev/cambricon_ctl"]
    ring = first.link_to(devices[1].uuid)
    assert ring is not None and (ring.kind, ring.gbps) == (LinkKind.MLULINK, 50.0)
    assert first.link_to(devices[4].uuid).kind is LinkKind.PCIE_HOST  # type: ignore[union-attr]
    assert counters[first.uuid] == {
        "ecc_correctable": 0,
        "ecc_uncorrectable": 0,
        "retirement_failures": 0,
    }


def test_unhealthy_card(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = cambricon_node(tmp_path, count=1)
    node.config.write_text(node.config.read_text().replace("health=1", "health=0"))
    monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(node.config))
    [device] = discover_once(
        CambriconBackend(node.section(cndev_library=str(fake_libs / "libcndev.so")))
    )
    assert device.health_state is HealthState.UNHEALTHY


def test_cnmon_parsing() -> None:
    cards = parse_cnmon((DATA / "cnmon-info-x8.txt").read_text())
    assert cards == [
        {
            "name": "MLU370-X8",
            "uuid": "MLU-20001012-1916-0000-0000-00000000a001",
            "bus": "0000:3d:00.0",
            "memory_mib": 49152,
        },
        {
            "name": "MLU370-X8",
            "uuid": "MLU-20001012-1916-0000-0000-00000000a002",
            "bus": "0000:3e:00.0",
            "memory_mib": 49152,
        },
    ]


def test_cnmon_fallback_when_cndev_is_missing(tmp_path: Path, devfs: Path) -> None:
    make_devfs(devfs, {"cambricon_dev0": (240, 0), "cambricon_dev1": (240, 1)})
    cnmon = tool(tmp_path, "cnmon", DATA / "cnmon-info-x8.txt")
    backend = CambriconBackend(
        DiscoverySection(
            cndev_library=str(tmp_path / "missing.so"),
            cnmon=str(cnmon),
            sysfs=str(tmp_path),
            dev_root=str(devfs),
        )
    )
    devices = backend.discover()
    assert [d.uuid for d in devices] == [
        "MLU-20001012-1916-0000-0000-00000000a001",
        "MLU-20001012-1916-0000-0000-00000000a002",
    ]
    assert dict(devices[0].attributes)["source"] == "cnmon"


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("", id="empty"),
        pytest.param("Card 0\nProduct Name : MLU370-X8\n", id="no-pci-no-memory"),
        pytest.param("Card 0\nPCIe Info\n    Bus num : zz\n", id="bad-bus"),
    ],
)
def test_cnmon_nonsense_is_a_clear_error(tmp_path: Path, output: str) -> None:
    recorded = tmp_path / "out.txt"
    recorded.write_text(output)
    cnmon = tool(tmp_path, "cnmon", recorded)
    backend = CambriconBackend(
        DiscoverySection(cndev_library=str(tmp_path / "missing.so"), cnmon=str(cnmon))
    )
    with pytest.raises(DiscoveryError, match="cnmon info listed no MLU"):
        backend.discover()


def test_throttle_reasons_and_pending_retirement_as_sub_health_readings(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = cambricon_node(tmp_path, count=3)
    text = node.config.read_text()
    text = text.replace(
        "uuid=20001012-1916-0000-0000-000000000001",
        "uuid=20001012-1916-0000-0000-000000000001 throttle=tdp,thermal_slowdown retired_pending=1",
    ).replace(
        "uuid=20001012-1916-0000-0000-000000000002",
        "uuid=20001012-1916-0000-0000-000000000002 throttle=unsupported "
        "retired_pending=unsupported",
    )
    node.config.write_text(text)
    monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(node.config))
    backend = CambriconBackend(node.section(cndev_library=str(fake_libs / "libcndev.so")))
    try:
        devices = backend.discover()
        gauges = backend.health_gauges()
    finally:
        backend.close()
    assert gauges[devices[0].uuid] == {"clock_event_reasons": 0, "retired_pages_pending": 0}
    # TDP reads as NVML's power cap (0x4), thermal slowdown as its HW thermal bit (0x40)
    assert gauges[devices[1].uuid] == {"clock_event_reasons": 0x44, "retired_pages_pending": 1}
    assert devices[2].uuid not in gauges  # neither call supported: no readings, never zeros


def test_a_failed_retirement_is_a_fatal_counter_and_unsupported_calls_are_not_retried(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = cambricon_node(tmp_path, count=2)
    text = node.config.read_text().replace(
        "uuid=20001012-1916-0000-0000-000000000001",
        "uuid=20001012-1916-0000-0000-000000000001 retired_failure=1",
    )
    node.config.write_text(text.replace(
        "uuid=20001012-1916-0000-0000-000000000000",
        "uuid=20001012-1916-0000-0000-000000000000 retired_pending=unsupported",
    ))  # fmt: skip
    monkeypatch.setenv("FAKE_CNDEV_CONFIG", str(node.config))
    library = str(fake_libs / "libcndev.so")
    backend = CambriconBackend(node.section(cndev_library=library))
    calls = ctypes.c_int.in_dll(ctypes.CDLL(library), "fake_cndev_retired_calls")
    try:
        devices = backend.discover()
        counters = backend.health_counters()
        backend.health_gauges()
        first = calls.value
        for _ in range(3):
            backend.health_counters()
            backend.health_gauges()
    finally:
        backend.close()
    assert COUNTER_SEVERITY["retirement_failures"] is Severity.FATAL
    assert counters[devices[1].uuid]["retirement_failures"] == 1
    assert "retirement_failures" not in counters[devices[0].uuid]
    # once per poll for the card that answers, never again for the one that did not
    assert calls.value - first == 3
