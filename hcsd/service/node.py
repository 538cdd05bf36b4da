"""The node as the API sees it: inventory + ledger + allocator, and a feed of changes.

Everything that changes state goes through here, on the event loop, so that the ledger write,
the in-memory view and the watch event for one operation happen in one step and in order.
`NodeService` is the only way in: callers (API, runtime front ends, health, hot-plug, metrics)
use its methods and never reach into the ledger or the inventory behind it. Every refusal,
whoever decides it, is counted and logged here (`refuse`), once.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from hcsd.allocator import AllocatorSection, Usage, choose
from hcsd.discovery import Inventory
from hcsd.discovery.fabric import Fabric
from hcsd.ledger import Ledger
from hcsd.ledger.ledger import Capacity
from hcsd.model import (
    Acceptance,
    Allocation,
    Device,
    HealthState,
    PodRef,
    Request,
    SpreadPolicy,
    VramViolation,
)
from hcsd.quantity import format_bytes
from hcsd.refusals import Reason, Refusal
from hcsd.service.feed import DeviceStatus, Event, EventKind, Subscription

__all__ = ["NodeService"]

log = logging.getLogger(__name__)


class NodeService:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        *,
        allocator: AllocatorSection | None = None,
        version: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inventory = inventory
        self._ledger = ledger
        self._policy: SpreadPolicy = (allocator or AllocatorSection()).policy
        self.version = version
        self.clock = clock
        self.started_at = clock()
        self._refusals: collections.Counter[Reason] = collections.Counter()
        self._uninjected = 0
        self._health_source = "off"
        self._devices: dict[str, Device] = {d.uuid: d for d in inventory.devices}
        self._subscriptions: set[Subscription] = set()
        self._sync_capacities()

    # -- queries ----------------------------------------------------------------------------

    @property
    def node_name(self) -> str:
        return self._inventory.node_name

    @property
    def backends(self) -> tuple[str, ...]:
        """The discovery backends the inventory came from."""
        return tuple(self._inventory.backends)

    @property
    def discovery_notes(self) -> tuple[str, ...]:
        """Why vendors' backends did not run (a node with zero devices says why)."""
        return tuple(self._inventory.notes)

    @property
    def fabric(self) -> Fabric:
        """The RDMA fabric the node is on, as discovery found it (or the config names it)."""
        return self._inventory.fabric

    def set_fabric(self, fabric: Fabric) -> None:
        """The fabric as read again (`hcsd.daemon.fabric_watch`): ports come up after boot."""
        self._inventory = replace(self._inventory, fabric=fabric)

    @property
    def seq(self) -> int:
        """Operations recorded in the ledger so far (the watch events' sequence)."""
        return self._ledger.seq

    @property
    def policy(self) -> SpreadPolicy:
        """Where requests without their own policy land (`allocator.policy`)."""
        return self._policy

    @property
    def health_source(self) -> str:
        """The health event source in use, "off" until health watching has started."""
        return self._health_source

    def devices(self) -> list[DeviceStatus]:
        counts: collections.Counter[str] = collections.Counter()
        for allocation in self._ledger.allocations():
            counts.update(allocation.device_uuids)
        return [
            DeviceStatus(
                device=d,
                vram_allocated=self._ledger.vram_used(d.uuid),
                compute_allocated=self._ledger.compute_used(d.uuid),
                allocations=counts[d.uuid],
            )
            for d in self._devices.values()
        ]

    def device(self, uuid: str) -> Device | None:
        return self._devices.get(uuid)

    def device_at_bus(self, bus_id: str) -> Device | None:
        """The device at a PCI address; one present on the bus wins over a LOST record left
        there (a card swapped for one with another UUID)."""
        found = [d for d in self._devices.values() if d.pci_bus_id == bus_id]
        present = [d for d in found if d.health_state is not HealthState.LOST]
        return next(iter(present or found), None)

    def device_status(self, uuid: str) -> DeviceStatus | None:
        for status in self.devices():
            if status.device.uuid == uuid:
                return status
        return None

    def allocations(self) -> list[Allocation]:
        return self._ledger.allocations()

    def allocation(self, container_id: str) -> Allocation | None:
        """What the container holds, or None."""
        return self._ledger.get(container_id)

    def holders(self, device_uuid: str) -> list[Allocation]:
        """The allocations that hold a slice of the device."""
        return [a for a in self._ledger.allocations() if device_uuid in a.device_uuids]

    def orphans(self) -> list[Allocation]:
        """Allocations on devices this node no longer has (kept, never dropped)."""
        return self._ledger.orphans()

    def refusal_counts(self) -> Mapping[Reason, int]:
        """Refusals so far by reason (`hcs_refusals_total`)."""
        return dict(self._refusals)

    @property
    def uninjected_count(self) -> int:
        """Containers found running without the edits they asked for
        (`hcs_uninjected_containers_total`)."""
        return self._uninjected

    @property
    def watcher_count(self) -> int:
        return len(self._subscriptions)

    # -- settings ---------------------------------------------------------------------------

    def set_policy(self, policy: SpreadPolicy) -> None:
        """A reloaded `allocator.policy`; applies from the next request."""
        self._policy = policy

    def set_health_source(self, source: str) -> None:
        self._health_source = source

    # -- operations -------------------------------------------------------------------------

    def allocate(self, request: Request) -> tuple[Allocation, bool, str]:
        """Choose devices and record the allocation; (allocation, created, chip model)."""
        who = _who(request)
        existing = self._ledger.get(request.container_id)
        if existing is not None:
            if self._same_shape(existing, request):
                return existing, False, self._model_of(existing)
            raise self.refuse(
                Refusal(
                    Reason.CONFLICT,
                    f"{who}: already holds a different allocation; release it first",
                )
            )
        usage = {
            d.uuid: Usage(self._ledger.vram_used(d.uuid), self._ledger.compute_used(d.uuid))
            for d in self._devices.values()
        }
        try:
            placement = choose(
                request, list(self._devices.values()), usage, default_policy=self._policy
            )
        except Refusal as e:
            raise self.refuse(e.about(who)) from e
        allocation = Allocation(
            container_id=request.container_id,
            grants=placement.grants,
            pod=request.pod,
            container_name=request.container_name,
            created=self.clock(),
            source=request.source,
            front_end=request.front_end,
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
                raise self.refuse(
                    Refusal(
                        Reason.NO_MATCHING_DEVICE,
                        f"{who}: device {grant.device_uuid} is not on this node",
                    )
                )
            if not device.health_state.schedulable:
                raise self.refuse(
                    Refusal(
                        Reason.UNHEALTHY,
                        f"{who}: device {grant.device_uuid} is {device.health_state.value}",
                    )
                )
        return self._record(allocation, who)

    def _record(self, allocation: Allocation, who: str) -> tuple[Allocation, bool]:
        try:
            held, created = self._ledger.allocate(allocation)
        except Refusal as e:
            raise self.refuse(e.about(who)) from e
        if created:
            log.info("%s: allocated %s", who, _grants_text(held))
            self._publish(EventKind.ALLOCATED, allocation=held)
            self._publish_devices(held)
        return held, created

    def release(self, container_id: str) -> Allocation | None:
        try:
            released = self._ledger.release(container_id)
        except Refusal as e:
            raise self.refuse(e.about(container_id)) from e
        if released is not None:
            log.info("%s: released %s", _who_allocation(released), _grants_text(released))
            self._publish(EventKind.RELEASED, allocation=released)
            self._publish_devices(released)
        return released

    def acceptance(self, pod_uid: str) -> Acceptance | None:
        """The pod's accepted scheduler assignment, if this node accepted one."""
        return self._ledger.acceptance(pod_uid)

    def acceptances(self) -> list[Acceptance]:
        return self._ledger.acceptances()

    def accept(self, acceptance: Acceptance) -> None:
        """Remember durably that the pod's assignment was accepted (before anything is held)."""
        try:
            self._ledger.accept(acceptance)
        except Refusal as e:
            raise self.refuse(e.about(acceptance.pod_uid)) from e

    def forget_pod(self, pod_uid: str) -> None:
        try:
            self._ledger.forget(pod_uid)
        except Refusal as e:
            raise self.refuse(e.about(pod_uid)) from e

    def set_device(self, device: Device) -> None:
        """Replace a device's record (health change, hot-plug) and tell the watchers."""
        self._devices[device.uuid] = device
        self._sync_capacities()
        status = self.device_status(device.uuid)
        self._publish(EventKind.DEVICE_CHANGED, device=status)

    def refuse(self, refusal: Refusal) -> Refusal:
        """Count and log a refusal, wherever it was decided; returns it for `raise`."""
        self._refusals[refusal.reason] += 1
        log.warning("%s", refusal.describe())
        return refusal

    def count_uninjected(self) -> None:
        """A front end found a container that asked for devices running without hcsd's edits
        (it logs the container; this only counts it)."""
        self._uninjected += 1

    def report_violation(self, violation: VramViolation) -> None:
        """Tell the watchers that the VRAM watchdog found a container over its grant (the
        watchdog has logged and acted already; this only carries it to the API)."""
        self._publish(EventKind.VRAM_OVER_QUOTA, violation=violation)

    def subscribe(self, *, send_initial: bool) -> Subscription:
        subscription = Subscription(self._unsubscribe)
        if send_initial:
            now = self.clock()
            seq = self._ledger.seq
            for status in self.devices():
                subscription.push(Event(EventKind.INITIAL, seq, now, device=status))
            for allocation in self.allocations():
                subscription.push(Event(EventKind.INITIAL, seq, now, allocation=allocation))
            subscription.push(Event(EventKind.SYNCED, seq, now))
        self._subscriptions.add(subscription)
        return subscription

    # -- internals --------------------------------------------------------------------------

    def _unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

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
        self._ledger.set_capacities(
            {uuid: Capacity(vram_bytes=d.vram_bytes) for uuid, d in self._devices.items()}
        )

    def _publish(
        self,
        kind: EventKind,
        *,
        allocation: Allocation | None = None,
        device: DeviceStatus | None = None,
        violation: VramViolation | None = None,
    ) -> None:
        if not self._subscriptions:
            return
        event = Event(
            kind,
            self._ledger.seq,
            self.clock(),
            allocation=allocation,
            device=device,
            violation=violation,
        )
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
