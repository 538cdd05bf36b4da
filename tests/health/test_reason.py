"""Why a device is not healthy travels with the device, one source for every reader: its
`health_reason` (in detail: `hcsctl devices --json`, the ComputeNode) and `health_cause` (in
stable words: the hcs_device_health_reason label) follow a new kind of fault even at the same
state and score, and a device removed from the bus says so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hcsd.daemon.hotplug import HotplugWatcher
from hcsd.daemon.metrics import exposition, registry
from hcsd.discovery import Inventory
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.watching import HealthWatcher
from hcsd.ledger import Ledger
from hcsd.model import HealthState
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry
from tests.unit.test_node_metrics import samples


def metric_reasons(service: NodeService, watcher: HealthWatcher | None) -> dict[str, str]:
    body, _ = exposition(registry(service, watcher, telemetry=Telemetry()), "")
    return {
        dict(labels)["device"]: dict(labels)["reason"]
        for (name, labels), _ in samples(body.decode()).items()
        if name == "hcs_device_health_reason"
    }


def test_a_new_kind_of_fault_replaces_the_old_reason(
    mixed_inventory: Inventory, ledger: Ledger, tmp_path: Path
) -> None:
    service = NodeService(mixed_inventory, ledger)
    device = next(s.device for s in service.devices() if s.device.pci_bus_id)
    watcher = HealthWatcher(service, HealthSection(), sysfs=str(tmp_path))
    for code in ("xid-79", "xid-48"):  # both fatal: unhealthy, score 0 both times
        watcher.on_event(
            HealthEvent(device.pci_bus_id, "nvidia", code, Severity.FATAL, f"{code} line", 0.0)
        )
        status = service.device_status(device.uuid)
        assert status is not None and status.device.health_state is HealthState.UNHEALTHY
        attributes = dict(status.device.attributes)
        assert attributes["health_reason"] == f"{code}: {code} line"
        assert attributes["health_cause"] == f"{code} (fatal)"
        assert metric_reasons(service, watcher) == {device.uuid: f"{code} (fatal)"}


def test_a_lost_device_says_why(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = NodeService(mixed_inventory, ledger)
    device = service.devices()[0].device
    words = (("subhealth", "pcie-link-width"), ("subhealth_node", "hw-power-brake"))
    device = replace(device, attributes=(*device.attributes, *words))
    HotplugWatcher(service, None, lambda: ())._mark_lost(device)  # type: ignore[arg-type]
    status = service.device_status(device.uuid)
    assert status is not None and status.device.health_state is HealthState.LOST
    assert dict(status.device.attributes)["health_reason"] == "removed from the bus"
    assert metric_reasons(service, None) == {device.uuid: "removed from the bus"}
    # off the bus, it runs below nothing: the sub-health words go with it
    assert not {"subhealth", "subhealth_node"} & set(dict(status.device.attributes))
