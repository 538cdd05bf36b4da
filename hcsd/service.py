"""The node as the API sees it: inventory + ledger + allocator, and a feed of changes.

Everything that changes state goes through here, on the event loop, so that the ledger write,
the in-memory view and the watch event for one operation happen in one step and in order.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NoReturn

from hcsd.allocator import NoFit, Usage, choose
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger, LedgerConflict, LedgerWriteError, OverCapacity
from hcsd.ledger.ledger import Capacity
from hcsd.model import Allocation, Device, PodRef, Request, SpreadPolicy
from hcsd.quantity import format_bytes

__all__ = [
    "DeviceStatus",
    "Event",
    "EventKind",
    "NodeService",
    "Refused",
    "Subscription",
    "WatchOverflow",
]

log = logging.getLogger(__name__)

WATCH_QUEUE = 1024


class Refused(Exception):
    """A request the node will not serve. `reason` labels the refusal metric.

    `temporary` says whether retrying the same request later may succeed without anything
    else changing (a full disk clears; an over-capacity request does not).
    """

    def __init__(self, reason: str, message: str, *, temporary: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.temporary = temporary


class WatchOverflow(Exception):
    """A watcher fell more than WATCH_QUEUE events behind; it must reconnect and resync."""


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    device: Device
    vram_allocated: int
    compute_allocated: int
    allocations: int

    @property
    def vram_free(self) -> int:
        return max(self.device.vram_bytes - self.vram_allocated, 0)


class EventKind:
    INITIAL = "initial"
    SYNCED = "synced"
    ALLOCATED = "allocated"
    RELEASED = "released"
    DEVICE_CHANGED = "device_changed"
    DEVICE_REMOVED = "device_removed"


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    seq: int
    time: float
    allocation: Allocation | None = None
    device: DeviceStatus | None = None


class Subscription:
    """One watcher's queue. Iterating yields events until the watcher is closed."""

    def __init__(self, service: NodeService) -> None:
        self._service = service
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=WATCH_QUEUE)
        self.overflowed = False

    def push(self, event: Event) -> None:
        if self.overflowed:
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True
            self._queue.get_nowait()  # make room for the end marker
            self._queue.put_nowait(None)

    def close(self) -> None:
        self._service._subscriptions.discard(self)

    async def __aiter__(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._queue.get()
                if event is None:
                    raise WatchOverflow(f"watcher fell more than {WATCH_QUEUE} events behind")
                yield event
        finally:
            self.close()


class NodeService:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        *,
        policy: SpreadPolicy = SpreadPolicy.BINPACK,
        version: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.policy = policy
        self.version = version
        self.clock = clock
        self.started_at = clock()
        self.refusals: collections.Counter[str] = collections.Counter()
        self.health_source = "off"  # set by the daemon once health watching has started
        self._devices: dict[str, Device] = {d.uuid: d for d in inventory.devices}
        self._subscriptions: set[Subscription] = set()
        self._sync_capacities()

    # -- queries ----------------------------------------------------------------------------

    @property
    def node_name(self) -> str:
        return self.inventory.node_name

    def devices(self) -> list[DeviceStatus]:
        counts: collections.Counter[str] = collections.Counter()
        for allocation in self.ledger.allocations():
            counts.update(allocation.device_uuids)
        return [
            DeviceStatus(
                device=d,
                vram_allocated=self.ledger.vram_used(d.uuid),
                compute_allocated=self.ledger.compute_used(d.uuid),
                allocations=counts[d.uuid],
            )
            for d in self._devices.values()
        ]

    def device(self, uuid: str) -> Device | None:
        return self._devices.get(uuid)

    def device_status(self, uuid: str) -> DeviceStatus | None:
        for status in self.devices():
            if status.device.uuid == uuid:
                return status
        return None

    def allocations(self) -> list[Allocation]:
        return self.ledger.allocations()

    @property
    def watcher_count(self) -> int:
        return len(self._subscriptions)

    # -- operations -------------------------------------------------------------------------

    def allocate(self, request: Request) -> tuple[Allocation, bool, str]:
        """Choose devices and record the allocation; (allocation, created, chip model)."""
        who = _who(request)
        existing = self.ledger.get(request.container_id)
        if existing is not None:
            if self._same_shape(existing, request):
                return existing, False, self._model_of(existing)
            self._refuse(
                "conflict", f"{who}: already holds a different allocation; release it first"
            )
        usage = {
            d.uuid: Usage(self.ledger.vram_used(d.uuid), self.ledger.compute_used(d.uuid))
            for d in self._devices.values()
        }
        try:
            placement = choose(
                request, list(self._devices.values()), usage, default_policy=self.policy
            )
        except NoFit as e:
            self._refuse(e.reason, f"{who}: {e}")
        allocation = Allocation(
            container_id=request.container_id,
            grants=placement.grants,
            pod=request.pod,
            container_name=request.container_name,
            created=self.clock(),
            source=request.source,
        )
        held, created = self._record(allocation, who)
        return held, created, placement.model

    def hold(self, allocation: Allocation) -> tuple[Allocation, bool]:
        """Record an allocation decided elsewhere (the scheduler's signed assignment).

        The devices must be on this node and schedulable, and the ledger must have room: the
        assignment may be older than the node's current state.
        """
        who = _who_allocation(allocation)
        for grant in allocation.grants:
            device = self._devices.get(grant.device_uuid)
            if device is None:
                self._refuse(
                    "no_matching_device", f"{who}: device {grant.device_uuid} is not on this node"
                )
            if not device.health_state.schedulable:
                self._refuse(
                    "unhealthy", f"{who}: device {grant.device_uuid} is {device.health_state.value}"
                )
        return self._record(allocation, who)

    def _record(self, allocation: Allocation, who: str) -> tuple[Allocation, bool]:
        try:
            held, created = self.ledger.allocate(allocation)
        except (OverCapacity, LedgerConflict) as e:
            self._refuse(e.reason, f"{who}: {e}")
        except LedgerWriteError as e:
            self._refuse(e.reason, f"{who}: {e}", temporary=True)
        if created:
            log.info("%s: allocated %s", who, _grants_text(held))
            self._publish(EventKind.ALLOCATED, allocation=held)
            self._publish_devices(held)
        return held, created

    def release(self, container_id: str) -> Allocation | None:
        try:
            released = self.ledger.release(container_id)
        except LedgerWriteError as e:
            self._refuse(e.reason, f"{container_id}: {e}", temporary=True)
        if released is not None:
            log.info("%s: released %s", _who_allocation(released), _grants_text(released))
            self._publish(EventKind.RELEASED, allocation=released)
            self._publish_devices(released)
        return released

    def set_device(self, device: Device) -> None:
        """Replace a device's record (health change, hot-plug) and tell the watchers."""
        self._devices[device.uuid] = device
        self._sync_capacities()
        status = self.device_status(device.uuid)
        self._publish(EventKind.DEVICE_CHANGED, device=status)

    def subscribe(self, *, send_initial: bool) -> Subscription:
        subscription = Subscription(self)
        if send_initial:
            now = self.clock()
            seq = self.ledger.seq
            for status in self.devices():
                subscription.push(Event(EventKind.INITIAL, seq, now, device=status))
            for allocation in self.allocations():
                subscription.push(Event(EventKind.INITIAL, seq, now, allocation=allocation))
            subscription.push(Event(EventKind.SYNCED, seq, now))
        self._subscriptions.add(subscription)
        return subscription

    # -- internals --------------------------------------------------------------------------

    def _refuse(self, reason: str, message: str, *, temporary: bool = False) -> NoReturn:
        self.refusals[reason] += 1
        log.warning("refused (%s): %s", reason, message)
        raise Refused(reason, message, temporary=temporary)

    def _same_shape(self, existing: Allocation, request: Request) -> bool:
        """Whether a repeated request asks for what the container already holds."""
        if request.vram_bytes is not None:
            if any(g.vram_bytes != request.vram_bytes for g in existing.grants):
                return False
        elif any(
            g.device_uuid not in self._devices
            or g.vram_bytes != self._devices[g.device_uuid].vram_bytes
            for g in existing.grants
        ):
            return False
        if request.tflops_fp16 is None:
            return len(existing.grants) == request.devices
        return len(existing.grants) >= request.devices

    def _model_of(self, allocation: Allocation) -> str:
        device = self._devices.get(allocation.grants[0].device_uuid)
        return device.model if device else ""

    def _sync_capacities(self) -> None:
        self.ledger.set_capacities(
            {uuid: Capacity(vram_bytes=d.vram_bytes) for uuid, d in self._devices.items()}
        )

    def _publish(
        self,
        kind: str,
        *,
        allocation: Allocation | None = None,
        device: DeviceStatus | None = None,
    ) -> None:
        if not self._subscriptions:
            return
        event = Event(kind, self.ledger.seq, self.clock(), allocation=allocation, device=device)
        for subscription in list(self._subscriptions):
            subscription.push(event)

    def _publish_devices(self, allocation: Allocation) -> None:
        if not self._subscriptions:
            return  # device status is rebuilt per event: skip the work when nobody listens
        for uuid in dict.fromkeys(allocation.device_uuids):
            status = self.device_status(uuid)
            if status is not None:
                self._publish(EventKind.DEVICE_CHANGED, device=status)


def _who(request: Request) -> str:
    return _container_label(request.pod, request.container_name, request.container_id)


def _who_allocation(allocation: Allocation) -> str:
    return _container_label(allocation.pod, allocation.container_name, allocation.container_id)


def _container_label(pod: PodRef, container_name: str, container_id: str) -> str:
    """`ns/pod/container` for Kubernetes containers, the id for the rest (log convention)."""
    if pod.name:
        return f"{pod}/{container_name or container_id[:12]}"
    return container_id


def _grants_text(allocation: Allocation) -> str:
    return ", ".join(f"{format_bytes(g.vram_bytes)} on {g.device_uuid}" for g in allocation.grants)
