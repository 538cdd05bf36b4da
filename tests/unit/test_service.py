from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import HealthState, Request, Vendor, VramViolation
from hcsd.refusals import Reason, Refusal
from hcsd.service import EventKind, NodeService
from tests.conftest import GiB


@pytest.fixture
def service(mixed_inventory: Inventory, ledger: Ledger) -> NodeService:
    return NodeService(mixed_inventory, ledger, clock=lambda: 1000.0)


def nvidia(cid: str, gib: int) -> Request:
    return Request(cid, vram_bytes=gib * GiB, vendors=frozenset({Vendor.NVIDIA}))


def test_allocate_then_repeat_returns_the_same(service: NodeService) -> None:
    first, created, model = service.allocate(nvidia("c1", 16))
    again, created_again, _ = service.allocate(nvidia("c1", 16))
    assert created and not created_again and first == again
    assert model == "A100-SXM4-80GB"
    assert service.seq == 1


def test_repeat_with_a_different_shape_is_a_conflict(service: NodeService) -> None:
    service.allocate(nvidia("c1", 16))
    with pytest.raises(Refusal, match="already holds a different allocation") as info:
        service.allocate(nvidia("c1", 32))
    assert info.value.reason == "conflict"
    assert service.refusal_counts() == {Reason.CONFLICT: 1}


def test_refusals_are_counted_by_reason(service: NodeService) -> None:
    with pytest.raises(Refusal) as info:
        service.allocate(nvidia("c1", 100))
    assert info.value.reason == "insufficient_vram" and not info.value.temporary
    assert service.refusal_counts() == {"insufficient_vram": 1}


def test_unhealthy_device_gets_nothing(service: NodeService) -> None:
    for status in service.devices():
        if status.device.vendor is Vendor.NVIDIA:
            service.set_device(replace(status.device, health_state=HealthState.UNHEALTHY))
    with pytest.raises(Refusal, match="unhealthy"):
        service.allocate(nvidia("c1", 1))


async def test_watch_sends_initial_state_then_changes(service: NodeService) -> None:
    service.allocate(nvidia("before", 8))
    subscription = service.subscribe(send_initial=True)
    service.allocate(nvidia("after", 8))
    service.release("before")
    kinds = []

    async def collect() -> None:
        async for event in subscription:
            kinds.append((event.kind, event.allocation.container_id if event.allocation else ""))
            if event.kind == EventKind.RELEASED:
                return

    await asyncio.wait_for(collect(), 1)
    assert kinds[:6] == [(EventKind.INITIAL, "")] * 6
    assert kinds[6:] == [
        (EventKind.INITIAL, "before"),
        (EventKind.SYNCED, ""),
        (EventKind.ALLOCATED, "after"),
        (EventKind.DEVICE_CHANGED, ""),
        (EventKind.RELEASED, "before"),
    ]
    assert service.watcher_count == 0  # closed when the iteration ended


async def test_slow_watcher_is_cut_off(service: NodeService) -> None:
    from hcsd.service import WATCH_QUEUE, WatchOverflow

    subscription = service.subscribe(send_initial=False)
    for i in range(WATCH_QUEUE):
        service.allocate(Request(f"c{i}", vram_bytes=1024 * 1024))
        service.release(f"c{i}")
    with pytest.raises(WatchOverflow):
        async for _ in subscription:
            pass


async def test_every_event_kind_is_published(service: NodeService) -> None:
    service.allocate(nvidia("before", 8))
    subscription = service.subscribe(send_initial=True)
    service.allocate(nvidia("after", 8))
    service.release("before")
    a100 = service.allocation("after")
    assert a100 is not None
    device = service.device(a100.grants[0].device_uuid)
    assert device is not None
    service.report_violation(
        VramViolation("after", device.uuid, 9 * GiB, 8 * GiB, 8 * GiB, -1, (7,), "warned")
    )
    service.set_device(replace(device, health_state=HealthState.DEGRADED, health_score=60))
    seen: set[EventKind] = set()

    async def collect() -> None:
        async for event in subscription:
            seen.add(event.kind)
            if event.device is not None and event.device.device.health_score == 60:
                return

    await asyncio.wait_for(collect(), 1)
    assert seen == set(EventKind)


def test_who_holds_a_device_and_which_device_is_at_a_bus(service: NodeService) -> None:
    first, _, _ = service.allocate(nvidia("c1", 8))
    second, _, _ = service.allocate(nvidia("c2", 8))  # binpack: the same A100
    uuid = first.grants[0].device_uuid
    assert (
        [a.container_id for a in service.holders(uuid)]
        == ["c1", "c2"]
        == [a.container_id for a in (first, second)]
    )
    device = service.device(uuid)
    assert device is not None
    assert service.device_at_bus(device.pci_bus_id) == device
    assert service.device_at_bus("0000:ff:1f.7") is None
    assert service.holders("no-such-device") == []


def test_a_card_swapped_at_a_bus_is_the_one_found_there(service: NodeService) -> None:
    """Hot-plug: a LOST record stays, and a new card (other UUID) appears at the same bus."""
    old = next(s.device for s in service.devices() if s.device.vendor is Vendor.NVIDIA)
    service.set_device(replace(old, health_state=HealthState.LOST, health_score=0))
    assert service.device_at_bus(old.pci_bus_id) == service.device(old.uuid)  # only the lost one
    new = replace(old, uuid="GPU-replacement")
    service.set_device(new)
    assert service.device_at_bus(old.pci_bus_id) == new


def test_settings_are_changed_through_methods(service: NodeService) -> None:
    from hcsd.model import SpreadPolicy

    service.allocate(nvidia("c1", 8))
    service.set_policy(SpreadPolicy.SPREAD)
    second, _, _ = service.allocate(nvidia("c2", 8))
    first = service.allocation("c1")
    assert first is not None and service.policy is SpreadPolicy.SPREAD
    assert second.grants[0].device_uuid != first.grants[0].device_uuid
    service.set_health_source("kmsg")
    assert service.health_source == "kmsg"


def test_refusals_decided_elsewhere_are_counted_here(service: NodeService) -> None:
    refusal = Refusal(Reason.BAD_ASSIGNMENT, "ns/pod/main: forged")
    assert service.refuse(refusal) is refusal
    assert service.refusal_counts() == {Reason.BAD_ASSIGNMENT: 1}


def test_every_event_kind_has_its_own_wire_kind() -> None:
    from hcsd.api.messages import event_to_pb
    from hcsd.service import Event

    wire = {event_to_pb(Event(kind, 0, 0.0)).kind for kind in EventKind}
    assert len(wire) == len(EventKind) and 0 not in wire  # none is KIND_UNSPECIFIED
