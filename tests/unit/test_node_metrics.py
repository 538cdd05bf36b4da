"""hcsd's /metrics through prometheus_client: what a scraper parses back, not the text's look."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from hcsd.daemon.metrics import exposition, registry
from hcsd.discovery import Inventory
from hcsd.health.events import HealthEvent, Severity
from hcsd.health.settings import HealthSection
from hcsd.health.watching import HealthWatcher
from hcsd.ledger import Ledger
from hcsd.model import HealthState, Request, Vendor
from hcsd.service import NodeService
from hcsd.telemetry import Telemetry
from tests.conftest import GiB

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(service: NodeService, accept: str = "") -> tuple[str, str]:
    body, kind = exposition(registry(service, telemetry=Telemetry()), accept)
    return body.decode(), kind


def test_label_values_are_escaped_and_read_back_whole(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    service = NodeService(mixed_inventory, ledger)
    device = service.devices()[0].device
    odd = 'A"100\\x\nnext line'
    service.set_device(replace(device, model=odd))
    text, _ = scrape(service)
    models = {
        dict(labels)["model"]
        for name, labels in samples(text)
        if name == "hcs_device_vram_capacity_bytes" and dict(labels)["device"] == device.uuid
    }
    assert models == {odd}


def test_openmetrics_when_the_scraper_asks_for_it(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    service = NodeService(mixed_inventory, ledger)
    text, kind = scrape(service, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert kind.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    names = {f.name for f in om_parse(text)}
    assert {"hcs_refusals", "hcs_device_health_state", "process_start_time_seconds"} <= names
    plain, kind = scrape(service, "text/plain")
    assert kind.startswith("text/plain; version=0.0.4") and "# EOF" not in plain


@pytest.mark.parametrize(
    "state",
    [HealthState.DEGRADED, HealthState.UNHEALTHY, HealthState.LOST],
)
def test_health_follows_the_device_and_leaves_no_stale_reason(
    mixed_inventory: Inventory, ledger: Ledger, state: HealthState
) -> None:
    service = NodeService(mixed_inventory, ledger)
    device = service.devices()[0].device

    def health() -> tuple[dict[str, float], list[dict[str, str]]]:
        found = samples(scrape(service)[0])
        states = {
            dict(labels)["state"]: value
            for (name, labels), value in found.items()
            if name == "hcs_device_health_state" and dict(labels)["device"] == device.uuid
        }
        reasons = [dict(k) for n, k in found if n == "hcs_device_health_reason"]
        return states, reasons

    service.set_device(replace(device, health_state=state, health_score=10))
    states, reasons = health()
    assert states == {s.value: (1.0 if s is state else 0.0) for s in HealthState}
    assert reasons == [{"device": device.uuid, "reason": state.value}]
    service.set_device(replace(device, health_state=HealthState.HEALTHY))
    states, reasons = health()
    assert states["healthy"] == 1.0 and states[state.value] == 0.0
    assert reasons == []


def test_acu_from_the_profile_for_each_known_model(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    found = samples(scrape(NodeService(mixed_inventory, ledger))[0])
    acu = {
        dict(labels)["model"]: value
        for (name, labels), value in found.items()
        if name == "hcs_device_acu" and dict(labels)["source"] == "profile"
    }
    assert acu["A100-SXM4-80GB"] == pytest.approx(100.0)  # the ACU is 1% of an A100


def test_latency_histograms_and_nri_registration(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    telemetry = Telemetry()
    found = registry(NodeService(mixed_inventory, ledger), telemetry=telemetry)
    assert found.get_sample_value("hcs_nri_registered") is None  # NRI off: not exported
    telemetry.nri_sessions = 1
    with telemetry.timed(telemetry.nri, "CreateContainer"):
        pass
    with pytest.raises(ValueError), telemetry.timed(telemetry.api, "Allocate"):
        raise ValueError("a failed call is timed too")
    assert found.get_sample_value("hcs_nri_registered") == 1
    for name, label in (("hcs_nri_hook", "hook"), ("hcs_api_request", "method")):
        value = "CreateContainer" if label == "hook" else "Allocate"
        count = found.get_sample_value(f"{name}_duration_seconds_count", {label: value})
        assert count == 1


def test_allocations_on_unschedulable_devices(mixed_inventory: Inventory, ledger: Ledger) -> None:
    service = NodeService(mixed_inventory, ledger)
    held, _, _ = service.allocate(Request("c1", vram_bytes=GiB, vendors=frozenset({Vendor.NVIDIA})))
    service.allocate(Request("c2", vram_bytes=GiB, vendors=frozenset({Vendor.HYGON})))
    device = service.device(held.device_uuids[0])
    assert device is not None
    found = registry(service)
    assert found.get_sample_value("hcs_allocations_on_unschedulable_devices") == 0
    service.set_device(replace(device, health_state=HealthState.UNHEALTHY))
    assert found.get_sample_value("hcs_allocations_on_unschedulable_devices") == 1


def _watched(service: NodeService) -> HealthWatcher:
    return HealthWatcher(service, HealthSection(), sysfs="/nonexistent")


def test_a_device_hot_plugged_back_under_a_new_uuid_scrapes_and_takes_events(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    service = NodeService(mixed_inventory, ledger)
    watcher = _watched(service)
    old = next(s.device for s in service.devices() if s.device.pci_bus_id)
    service.set_device(replace(old, health_state=HealthState.LOST, health_score=0))
    back = replace(old, uuid="GPU-back-under-a-new-uuid", health_state=HealthState.HEALTHY)
    service.set_device(back)
    line = "NVRM: Xid (PCI:...): 79, pid=1, GPU has fallen off the bus"
    watcher.on_event(HealthEvent(old.pci_bus_id, "nvidia", "xid-79", Severity.FATAL, line, 0.0))
    found = samples(scrape_with(service, watcher))
    reasons = {dict(k)["device"]: dict(k)["reason"] for n, k in found if n.endswith("reason")}
    assert reasons[back.uuid] == "xid-79 (fatal)"
    assert reasons[old.uuid] == "lost"


def test_the_reason_label_stays_the_same_while_the_fault_goes_on(
    mixed_inventory: Inventory, ledger: Ledger
) -> None:
    service = NodeService(mixed_inventory, ledger)
    watcher = _watched(service)
    device = next(s.device for s in service.devices() if s.device.pci_bus_id)
    seen = set()
    for pid in (101, 202, 303):
        line = f"NVRM: Xid (PCI:{device.pci_bus_id}): 13, pid={pid}, name=python{pid}, fault"
        watcher.on_event(
            HealthEvent(device.pci_bus_id, "nvidia", "xid-13", Severity.DEGRADING, line, 0.0)
        )
        found = samples(scrape_with(service, watcher))
        seen |= {dict(k)["reason"] for n, k in found if n == "hcs_device_health_reason"}
    assert seen == {"xid-13 (degrading)"}
    assert "pid=303" in watcher.analyzer.reason(device.uuid)  # the details stay for the log


def scrape_with(service: NodeService, watcher: HealthWatcher) -> str:
    return exposition(registry(service, watcher, telemetry=Telemetry()))[0].decode()
