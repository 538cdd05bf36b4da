"""hcsctl's tables and metrics text, checked on data alone."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hcsd.api.messages import allocation_to_pb, device_to_pb
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cli import tables
from hcsd.daemon.metrics import render_metrics
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import Request, Vendor
from hcsd.refusals import Refusal
from hcsd.service import NodeService
from tests.conftest import GiB


def make_service(inventory: Inventory, ledger: Ledger) -> NodeService:
    service = NodeService(inventory, ledger, clock=lambda: 1.0)
    service.allocate(Request("c-16", vram_bytes=16 * GiB, vendors=frozenset({Vendor.NVIDIA})))
    service.allocate(Request("c-pair", devices=2, vendors=frozenset({Vendor.ASCEND})))
    return service


def test_devices_table(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = make_service(mixed_inventory, ledger)
    text = tables.devices_table([device_to_pb(s) for s in service.devices()])
    lines = text.splitlines()
    assert lines[0].split() == [
        "VENDOR",
        "IDX",
        "MODEL",
        "UUID",
        "PCI",
        "VRAM",
        "USED/TOTAL",
        "FREE",
        "FP16",
        "TFLOPS",
        "MEASURED",
        "HEALTH",
        "ALLOCS",
        "LINKS",
    ]
    assert len(lines) == 7
    a100 = next(line for line in lines if "a100a000" in line)
    assert "16Gi/80Gi" in a100 and " 64Gi " in a100 and "nvlink→nvidia/1" in a100
    ascend = next(line for line in lines if "000000000000" in line and "ascend" in line)
    assert "64Gi/64Gi" in ascend and " 0 " in ascend and "hccs→ascend/1" in ascend
    # columns line up: every row has the VRAM column at the same offset
    column = lines[0].index("VRAM USED/TOTAL")
    assert all(line[column - 2 : column] == "  " for line in lines)


def test_devices_table_names_the_sub_health_reasons(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    devices = [device_to_pb(s) for s in make_service(mixed_inventory, ledger).devices()]
    devices[0].health_state = pb.HEALTH_STATE_DEGRADED
    devices[0].attributes["subhealth"] = "hw-slowdown,pcie-link-width"
    devices[0].attributes["health_cause"] = "hw-slowdown,pcie-link-width"
    # unhealthy for a fault: the fault is the cause, the sub-health signal listed apart
    devices[1].health_state = pb.HEALTH_STATE_UNHEALTHY
    devices[1].attributes["subhealth"] = "pcie-link-width"
    devices[1].attributes["health_cause"] = "xid-79 (fatal)"
    lines = tables.devices_table(devices).splitlines()
    assert "  degraded (hw-slowdown,pcie-link-width)  " in lines[1]
    assert "  unhealthy (xid-79 (fatal); sub-health: pcie-link-width)  " in lines[2]
    assert [line for line in lines if "(" in line] == lines[1:3]  # the others: the state alone


def test_allocations_table(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = make_service(mixed_inventory, ledger)
    devices = [device_to_pb(s) for s in service.devices()]
    text = tables.allocations_table([allocation_to_pb(a) for a in service.allocations()], devices)
    assert text.splitlines() == [
        "CONTAINER  POD  NAME  DEVICE    VRAM  COMPUTE  SOURCE",
        "c-16       -    -     nvidia/0  16Gi  -        api",
        "c-pair     -    -     ascend/0  64Gi  100%     api",
        "                      ascend/1  64Gi  100%",
    ]
    assert tables.allocations_table([], devices) == "no allocations\n"


def test_status_lines(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = make_service(mixed_inventory, ledger)
    node = pb.Node(
        name="n1",
        version="0.1.0",
        backends=["simulated"],
        ledger_seq=2,
        device_count=6,
        allocation_count=2,
        orphaned_containers=["gone"],
    )
    text = tables.status_lines(node, [device_to_pb(s) for s in service.devices()])
    assert "vram:        144Gi allocated of 368Gi" in text
    assert "orphaned:    gone (devices gone)" in text


def test_metrics_text(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = make_service(mixed_inventory, ledger)
    for container in ("huge-1", "huge-2"):
        with pytest.raises(Refusal):
            service.allocate(Request(container, vram_bytes=1024 * GiB))
    text = render_metrics(service)
    assert "# TYPE hcs_device_vram_capacity_bytes gauge" in text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    a100 = (
        ("device", "GPU-5b2f0c0e-8d1a-4c11-9d2e-a100a100a000"),
        ("index", "0"),
        ("model", "A100-SXM4-80GB"),
        ("vendor", "nvidia"),
    )
    assert samples["hcs_device_vram_allocated_bytes", a100] == 16 * GiB
    assert samples["hcs_refusals_total", (("reason", "insufficient_vram"),)] == 2
    assert samples["hcs_refusals_total", (("reason", "conflict"),)] == 0
    assert samples["hcs_allocations", ()] == 2
    assert any(n == "hcs_device_health_score" and "DCU-z100" in str(k) for n, k in samples)
