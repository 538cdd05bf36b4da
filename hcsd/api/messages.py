"""Between the model and the wire: model objects to protobuf, AllocateRequest to a Request.

Parsing lives here, not in clients, so that hcsctl, the OCI hook and the syncer all get the same
validation and the same error text for the same bad input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.benchmarks import Outcome
from hcsd.model import (
    Allocation,
    DeviceNode,
    FrontEnd,
    Grant,
    HealthState,
    PodRef,
    Request,
    SpreadPolicy,
    TopologyPreference,
    Vendor,
    VramViolation,
)
from hcsd.quantity import QuantityError, parse_bytes, parse_quantity
from hcsd.runtime.claims import ClaimDevice
from hcsd.service import DeviceStatus, Event, EventKind

__all__ = [
    "InvalidRequest",
    "allocation_to_pb",
    "claim_devices_from_pb",
    "device_to_pb",
    "event_to_pb",
    "outcome_to_pb",
    "pb_to_allocation",
    "request_from_pb",
    "violation_to_pb",
]

_HEALTH = {
    HealthState.HEALTHY: pb.HEALTH_STATE_HEALTHY,
    HealthState.DEGRADED: pb.HEALTH_STATE_DEGRADED,
    HealthState.UNHEALTHY: pb.HEALTH_STATE_UNHEALTHY,
    HealthState.LOST: pb.HEALTH_STATE_LOST,
}
HEALTH_NAMES = {value: key.value for key, value in _HEALTH.items()}
_EVENT_KINDS = {
    EventKind.INITIAL: pb.Event.KIND_INITIAL,
    EventKind.SYNCED: pb.Event.KIND_SYNCED,
    EventKind.ALLOCATED: pb.Event.KIND_ALLOCATED,
    EventKind.RELEASED: pb.Event.KIND_RELEASED,
    EventKind.DEVICE_CHANGED: pb.Event.KIND_DEVICE_CHANGED,
    EventKind.VRAM_OVER_QUOTA: pb.Event.KIND_VRAM_OVER_QUOTA,
}
_E = TypeVar("_E", SpreadPolicy, TopologyPreference)
_SOURCES = {"", "api", "local", "assignment"}
_MAX_LIST = 32
_MAX_NAME = 253


class InvalidRequest(ValueError):
    """The request is malformed; the message says which field and why."""


def request_from_pb(message: pb.AllocateRequest) -> Request:
    try:
        vram = parse_bytes(message.vram, what="vram") if message.vram else None
        tflops = None
        if message.tflops_fp16:
            value = parse_quantity(message.tflops_fp16)
            tflops = float(value)
            if value <= 0:
                raise InvalidRequest(f"tflops-fp16 must be positive, got {message.tflops_fp16!r}")
        vendors = frozenset(Vendor.parse(v) for v in _bounded(message.vendors, "vendors"))
        models = frozenset(m.strip() for m in _bounded(message.models, "models") if m.strip())
        policy = _enum(SpreadPolicy, message.policy, "policy") if message.policy else None
        topology = _enum(TopologyPreference, message.topology, "topology")
        if message.source not in _SOURCES:
            raise InvalidRequest(
                f"source must be one of api, local, assignment, got {message.source!r}"
            )
        for field, text in (
            ("pod.namespace", message.pod.namespace),
            ("pod.name", message.pod.name),
            ("pod.uid", message.pod.uid),
            ("container_name", message.container_name),
        ):
            if len(text) > _MAX_NAME:
                raise InvalidRequest(f"{field} is longer than {_MAX_NAME} characters")
        return Request(
            container_id=message.container_id,
            vram_bytes=vram,
            devices=message.devices or 1,
            tflops_fp16=tflops,
            compute_percent=message.compute_percent,
            vendors=vendors,
            models=models,
            policy=policy,
            topology=topology,
            pod=PodRef(message.pod.namespace, message.pod.name, message.pod.uid),
            container_name=message.container_name,
            source=message.source or "api",
        )
    except InvalidRequest:
        raise
    except (QuantityError, ValueError) as e:
        raise InvalidRequest(str(e)) from e


def claim_devices_from_pb(devices: Sequence[pb.ClaimDevice]) -> list[ClaimDevice]:
    """A claim's allocation results as sent: memory in bytes, compute a whole percent."""
    if len(devices) > _MAX_LIST:
        raise InvalidRequest(f"devices: at most {_MAX_LIST} entries")
    parsed = []
    for d in devices:
        for field, text in (("request", d.request), ("device", d.device), ("pool", d.pool)):
            if len(text) > _MAX_NAME:
                raise InvalidRequest(f"{field} is longer than {_MAX_NAME} characters")
        try:
            memory = parse_bytes(d.memory, what="memory") if d.memory else None
            compute = parse_quantity(d.compute) if d.compute else None
        except QuantityError as e:
            raise InvalidRequest(f"device {d.device!r}: {e}") from e
        if compute is not None and (compute != int(compute) or not 0 <= compute <= 100):
            raise InvalidRequest(f"device {d.device!r}: compute must be 0-100, got {d.compute!r}")
        parsed.append(
            ClaimDevice(
                request=d.request,
                device=d.device,
                pool=d.pool,
                share_id=d.share_id[:_MAX_NAME],
                memory_bytes=memory,
                compute_percent=None if compute is None else int(compute),
            )
        )
    return parsed


def _bounded(items: object, what: str) -> list[str]:
    values = list(items)  # type: ignore[call-overload]
    if len(values) > _MAX_LIST:
        raise InvalidRequest(f"{what}: at most {_MAX_LIST} entries")
    return [str(v) for v in values]


def _enum(kind: type[_E], text: str, what: str) -> _E:
    try:
        return kind(text)
    except ValueError:
        choices = ", ".join(repr(v.value) for v in kind)
        raise InvalidRequest(f"{what} must be one of {choices}, got {text!r}") from None


def device_to_pb(status: DeviceStatus) -> pb.Device:
    d = status.device
    return pb.Device(
        uuid=d.uuid,
        vendor=d.vendor.value,
        model=d.model,
        index=d.index,
        pci_bus_id=d.pci_bus_id,
        numa_node=d.numa_node,
        vram_bytes=d.vram_bytes,
        tflops_fp16=d.tflops_fp16,
        tflops_bf16=d.tflops_bf16,
        tflops_fp32=d.tflops_fp32,
        tops_int8=d.tops_int8,
        links=[pb.Link(peer_uuid=x.peer_uuid, kind=x.kind.value, gbps=x.gbps) for x in d.links],
        device_nodes=[_node(n) for n in d.device_nodes],
        shared_nodes=[_node(n) for n in d.shared_nodes],
        health_score=d.health_score,
        health_state=_HEALTH[d.health_state],
        attributes=dict(d.attributes),
        vram_allocated_bytes=status.vram_allocated,
        compute_allocated_percent=status.compute_allocated,
        allocation_count=status.allocations,
    )


def _node(node: DeviceNode) -> pb.DeviceNode:
    return pb.DeviceNode(
        path=node.path,
        major=node.major,
        minor=node.minor,
        type=node.kind,
        permissions=node.permissions,
    )


def allocation_to_pb(allocation: Allocation) -> pb.Allocation:
    pod = allocation.pod
    return pb.Allocation(
        container_id=allocation.container_id,
        pod=pb.PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid),
        container_name=allocation.container_name,
        grants=[
            pb.Grant(
                device_uuid=g.device_uuid,
                vram_bytes=g.vram_bytes,
                compute_percent=g.compute_percent,
            )
            for g in allocation.grants
        ],
        created=allocation.created,
        source=allocation.source,
        front_end=allocation.front_end.value,
    )


def pb_to_allocation(message: pb.Allocation) -> Allocation:
    return Allocation(
        container_id=message.container_id,
        grants=tuple(Grant(g.device_uuid, g.vram_bytes, g.compute_percent) for g in message.grants),
        pod=PodRef(message.pod.namespace, message.pod.name, message.pod.uid),
        container_name=message.container_name,
        created=message.created,
        source=message.source,
        front_end=FrontEnd.parse(message.front_end),
    )


def event_to_pb(event: Event) -> pb.Event:
    message = pb.Event(kind=_EVENT_KINDS[event.kind], seq=event.seq, time=event.time)
    if event.allocation is not None:
        message.allocation.CopyFrom(allocation_to_pb(event.allocation))
    if event.device is not None:
        message.device.CopyFrom(device_to_pb(event.device))
    if event.violation is not None:
        message.violation.CopyFrom(violation_to_pb(event.violation))
    return message


def violation_to_pb(violation: VramViolation) -> pb.VramViolation:
    return pb.VramViolation(
        container_id=violation.container_id,
        pod=pb.PodRef(
            namespace=violation.pod.namespace, name=violation.pod.name, uid=violation.pod.uid
        ),
        container_name=violation.container_name,
        device_uuid=violation.device_uuid,
        used_bytes=violation.used_bytes,
        granted_bytes=violation.granted_bytes,
        allowed_bytes=violation.allowed_bytes,
        accounted_bytes=violation.accounted_bytes,
        pids=list(violation.pids),
        action=violation.action,
    )


def outcome_to_pb(outcome: Outcome) -> pb.MeasureResult:
    """One device's outcome of `Measure`; figures 0 where there are none."""
    m = outcome.measurement
    return pb.MeasureResult(
        uuid=outcome.uuid,
        outcome=outcome.status,
        message=outcome.message,
        tflops_fp16=m.tflops_fp16 if m else 0.0,
        ratio=(m.ratio or 0.0) if m else 0.0,
        memory_bandwidth_gbps=(m.bandwidth_gbps or 0.0) if m else 0.0,
        seconds=m.seconds if m else 0.0,
    )
