from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from hcsd.discovery import Inventory
from hcsd.ledger import Ledger
from hcsd.model import HealthState, Request, Vendor
from hcsd.service import EventKind, NodeService, Refused
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
    assert service.ledger.seq == 1


def test_repeat_with_a_different_shape_is_a_conflict(service: NodeService) -> None:
    service.allocate(nvidia("c1", 16))
    with pytest.raises(Refused, match="already holds a different allocation") as info:
        service.allocate(nvidia("c1", 32))
    assert info.value.reason == "conflict"
    assert service.refusals["conflict"] == 1


def test_refusals_are_counted_by_reason(service: NodeService) -> None:
    with pytest.raises(Refused) as info:
        service.allocate(nvidia("c1", 100))
    assert info.value.reason == "insufficient_vram" and not info.value.temporary
    assert service.refusals == {"insufficient_vram": 1}


def test_unhealthy_device_gets_nothing(service: NodeService) -> None:
    for status in service.devices():
        if status.device.vendor is Vendor.NVIDIA:
            service.set_device(replace(status.device, health_state=HealthState.UNHEALTHY))
    with pytest.raises(Refused, match="unhealthy"):
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
