"""The NVIDIA backend through the real pynvml bindings over a fake libnvidia-ml.so.1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.discovery import DiscoveryError, discover_all
from hcsd.discovery.backends.nvidia import NvidiaBackend
from hcsd.discovery.settings import DiscoverySection
from hcsd.model import DeviceNode, LinkKind
from tests.fakes import write_config
from tests.fakes.nodes import FakeNode, discover_once, nvidia_node

GiB = 2**30


@pytest.fixture
def node(tmp_path: Path, devfs: Path, fake_libs: Path) -> FakeNode:
    return nvidia_node(tmp_path)


@pytest.fixture
def backend(
    node: FakeNode, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[NvidiaBackend]:
    for key, value in node.env.items():
        monkeypatch.setenv(key, value)
    backend = NvidiaBackend(node.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    yield backend
    backend.close()


def test_eight_gpus_with_identity_memory_and_nodes(backend: NvidiaBackend) -> None:
    devices = backend.discover()
    assert len(devices) == 8
    first = devices[0]
    assert first.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert first.model == "A100-SXM4-80GB"
    assert first.pci_bus_id == "0000:17:00.0"  # NVML's 00000000:17:00.0, normalised
    assert first.vram_bytes == 80 * GiB
    assert first.tflops_fp16 == 312.0
    assert first.numa_node == 0 and devices[7].numa_node == 1
    assert first.device_nodes == (DeviceNode("/dev/nvidia0", 195, 0),)
    assert {n.path for n in first.shared_nodes} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }
    attributes = dict(first.attributes)
    assert attributes["compute_capability"] == "8.0"
    assert attributes["mig_mode"] == "disabled"
    assert attributes["pcie_link"] == "16 GT/s x16"
    assert attributes["profile"] == "nvidia/A100-SXM4-80GB"


def test_nvswitch_joins_every_pair(backend: NvidiaBackend) -> None:
    devices = backend.discover()
    for device in devices:
        assert len(device.links) == 7
        assert all(link.kind is LinkKind.NVLINK for link in device.links)
        assert all(link.gbps == 300.0 for link in device.links)  # 12 links x 25 GB/s
    discover_all("node", [_Fixed(devices)])  # links point at devices that exist


@pytest.mark.parametrize(
    ("topology", "peer", "kind", "gbps"),
    [
        pytest.param("pairs", 1, LinkKind.NVLINK, 100.0, id="bridged-pair"),
        pytest.param("pairs", 2, LinkKind.PCIE_SWITCH, 31.51, id="same-socket-pcie"),
        pytest.param("pcie", 5, LinkKind.SYSTEM, 31.51, id="across-sockets"),
    ],
)
def test_links_without_nvswitch(
    tmp_path: Path,
    devfs: Path,
    fake_libs: Path,
    monkeypatch: pytest.MonkeyPatch,
    topology: str,
    peer: int,
    kind: LinkKind,
    gbps: float,
) -> None:
    node = nvidia_node(tmp_path, topology=topology)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    devices = discover_once(
        NvidiaBackend(node.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    )
    link = devices[0].link_to(devices[peer].uuid)
    assert link is not None
    assert (link.kind, link.gbps) == (kind, gbps)


def test_mig_enabled_is_reported_not_fatal(
    tmp_path: Path, devfs: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = nvidia_node(tmp_path, count=2, overrides={1: {"mig": 1}})
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    devices = discover_once(
        NvidiaBackend(node.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    )
    assert dict(devices[1].attributes)["mig_mode"] == "enabled"
    assert devices[1].vram_bytes == 80 * GiB


def test_unknown_model_keeps_raw_figures_and_warns(
    tmp_path: Path,
    devfs: Path,
    fake_libs: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = nvidia_node(tmp_path, count=1, name="NVIDIA Future GPU 9000")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    [device] = discover_once(
        NvidiaBackend(node.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    )
    assert device.model == "NVIDIA Future GPU 9000"
    assert device.vram_bytes == 80 * GiB
    assert dict(device.attributes)["profile"] == "unknown"
    assert "not in the profile database" in caplog.text


def test_health_counters_follow_the_driver(backend: NvidiaBackend, node: FakeNode) -> None:
    devices = backend.discover()
    before = backend.health_counters()
    assert before[devices[0].uuid] == {
        "ecc_correctable": 0,
        "ecc_uncorrectable": 0,
        "row_remap_failures": 0,
        "remapped_rows_correctable": 0,
        "pcie_replays": 0,
        "link_errors": 0,
    }
    text = node.config.read_text().replace(
        "uuid=GPU-00000000-0000-0000-0000-000000000003",
        "uuid=GPU-00000000-0000-0000-0000-000000000003 ecc_uncorrected=2 remap_failed=1",
    )
    node.config.write_text(text)
    stat = node.config.stat()
    os.utime(node.config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = backend.health_counters()[devices[3].uuid]
    assert after["ecc_uncorrectable"] == 2
    assert after["row_remap_failures"] == 1


def test_sub_health_readings_follow_the_driver(backend: NvidiaBackend, node: FakeNode) -> None:
    devices = backend.discover()
    assert backend.health_gauges()[devices[0].uuid] == {
        "clock_event_reasons": 0,
        "busy": 1,  # utilization 100%
        "sm_clock_mhz": 1410,
        "sm_clock_max_mhz": 1410,
        "sm_clock_applications_mhz": 1410,
        "row_remap_pending": 0,  # retired pages: unsupported on this Ampere, left out
    }
    text = node.config.read_text().replace(
        "uuid=GPU-00000000-0000-0000-0000-000000000002",
        "uuid=GPU-00000000-0000-0000-0000-000000000002 clock_reasons=0x48 sm_clock_now=600 "
        "remap_pending=1 util=20 app_clock=1200",
    )
    node.config.write_text(text)
    stat = node.config.stat()
    os.utime(node.config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = backend.health_gauges()[devices[2].uuid]
    assert after["clock_event_reasons"] == 0x48
    assert after["sm_clock_mhz"] == 600
    assert after["row_remap_pending"] == 1
    assert after["busy"] == 0  # utilization 20%: not busy
    assert after["sm_clock_applications_mhz"] == 1200


_OLD_DRIVER = """
import sys
from hcsd.discovery.backends.nvidia import NvidiaBackend
from hcsd.discovery.settings import DiscoverySection
backend = NvidiaBackend(DiscoverySection(sysfs=sys.argv[1], dev_root=sys.argv[2],
                                         nvml_library=sys.argv[3]))
devices = backend.discover()
print(backend.health_gauges()[devices[1].uuid]["clock_event_reasons"])
"""


def test_clock_reasons_under_their_old_name_on_an_older_driver(
    tmp_path: Path, devfs: Path, fake_libs: Path
) -> None:
    """A driver from before nvmlDeviceGetCurrentClocksEventReasons (535) has only the
    ThrottleReasons name. pynvml holds one library per process: this runs in its own."""
    node = nvidia_node(tmp_path, count=2, overrides={1: {"clock_reasons": "0x8"}})
    library = fake_libs / "v1" / "libnvidia-ml.so.1"
    done = subprocess.run(
        [sys.executable, "-c", _OLD_DRIVER, str(node.sysfs), str(node.dev), str(library)],
        env={**os.environ, **node.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "8"


def test_a_missing_library_is_a_clear_error(tmp_path: Path, node: FakeNode) -> None:
    backend = NvidiaBackend(
        DiscoverySection(nvml_library=str(tmp_path / "nope.so"), sysfs=str(node.sysfs))
    )
    with pytest.raises(DiscoveryError, match=r"failed to load NVML from .*nope\.so"):
        backend.discover()


def test_a_missing_device_node_is_a_clear_error(
    tmp_path: Path, fake_libs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = nvidia_node(tmp_path, count=1, mknod=False)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(node.config))
    backend = NvidiaBackend(node.section(nvml_library=str(fake_libs / "libnvidia-ml.so.1")))
    try:
        with pytest.raises(DiscoveryError, match="nvidia0"):
            backend.discover()
    finally:
        backend.close()


def test_config_helper_quotes_names(tmp_path: Path) -> None:
    path = write_config(tmp_path / "c", [("device", {"name": "A B", "n": 1})])
    assert path.read_text() == 'device name="A B" n=1\n'


class _Fixed:
    name = "fixed"

    def __init__(self, devices: object) -> None:
        self.devices = devices

    def discover(self) -> object:
        return self.devices
