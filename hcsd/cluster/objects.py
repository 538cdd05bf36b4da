"""ComputeNode objects: built from hcsd's local API by the syncer, read back by the extender.

Pure functions, no I/O. The syncer compares what it would write with what it wrote last, so
the shapes here must be deterministic (sorted lists, no clocks except condition transition
times carried over from the previous status), or every resync would be a write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hcsd.allocator import Usage
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.health_status import (
    REASON_MAX,
    device_reason,
    device_subhealth,
    node_subhealth,
    why,
)
from hcsd.cluster.measured import MEASURED_BOUNDS, fingerprint_of, measured_of, published
from hcsd.contract.dra import MODE_DRA, MODE_EXTENDER, MODE_LABEL
from hcsd.contract.names import API_VERSION, COMPUTE_NODE_KIND, NODE_LABEL
from hcsd.model import Device, Grant, HealthState, Link, LinkKind, Vendor
from hcsd.profiles.database import default_database
from hcsd.quantity import format_bytes

log = logging.getLogger(__name__)

__all__ = [
    "MEASURED_BOUNDS",
    "NodeView",
    "PodHold",
    "acu",
    "compute_node",
    "fingerprint_of",
    "measured_of",
    "node_spec",
    "node_status",
    "node_view",
    "published",
]

_HEALTH = {
    pb.HEALTH_STATE_HEALTHY: HealthState.HEALTHY,
    pb.HEALTH_STATE_DEGRADED: HealthState.DEGRADED,
    pb.HEALTH_STATE_UNHEALTHY: HealthState.UNHEALTHY,
    pb.HEALTH_STATE_LOST: HealthState.LOST,
}


MESSAGE_MAX = 65536  # status.conditions[].message maxLength
FABRIC_PORTS_MAX = 64  # crds/computenodes.yaml: spec.fabric.ports maxItems
FABRIC_NOTES_MAX = 8  # spec.fabric.notes maxItems
FABRIC_LINE_MAX = 256  # spec.fabric.ports[] maxLength


def acu(tflops_fp16: float) -> float:
    """A device's abstract compute units: its FP16 TFLOPS over one ACU's (1% of an A100 in the
    shipped profile database), one decimal, so the figure is stable from write to write."""
    return round(tflops_fp16 / default_database().acu_tflops, 1)


def node_spec(node: pb.Node, devices: Sequence[pb.Device]) -> dict[str, Any]:
    """The inventory: what the node has, changing only on hot-plug or a new fingerprint."""
    devices = [published(d) for d in devices]
    return {
        "nodeName": node.name,
        "hcsdVersion": node.version,
        "backends": sorted(node.backends),
        "devices": [
            {
                "uuid": d.uuid,
                "vendor": d.vendor,
                "model": d.model,
                "index": d.index,
                "pciBusID": d.pci_bus_id,
                "numaNode": d.numa_node,
                "vramBytes": d.vram_bytes,
                "tflopsFP16": round(d.tflops_fp16, 3),
                "tflopsBF16": round(d.tflops_bf16, 3),
                "tflopsFP32": round(d.tflops_fp32, 3),
                "topsINT8": round(d.tops_int8, 3),
                "fingerprint": fingerprint_of(d),
                **({"measured": m} if (m := measured_of(d)) else {}),
                "links": [
                    {"peer": link.peer_uuid, "kind": link.kind, "gbps": round(link.gbps, 3)}
                    for link in sorted(d.links, key=lambda link: link.peer_uuid)
                ],
            }
            for d in sorted(devices, key=lambda d: (d.vendor, d.index, d.uuid))
        ],
        **_fabric(node),
    }


def _fabric(node: pb.Node) -> dict[str, Any]:
    """`fabric`: the node's RDMA fabric domain as hcsd reports it (hcsd.discovery.fabric),
    left out when hcsd saw no RDMA port and was given no domain."""
    if not (node.fabric_domain or node.fabric_ports or node.fabric_notes):
        return {}
    return {
        "fabric": {
            "domain": node.fabric_domain,
            "source": node.fabric_source,
            "ports": [p[:FABRIC_LINE_MAX] for p in node.fabric_ports][:FABRIC_PORTS_MAX],
            "notes": [n[:REASON_MAX] for n in node.fabric_notes][:FABRIC_NOTES_MAX],
        }
    }


def _condition(
    kind: str, ok: bool, reason: str, message: str, *, previous: Mapping[str, Any], now: str
) -> dict[str, str]:
    """A condition whose transition time only moves when its status does."""
    status = "True" if ok else "False"
    old = {c.get("type"): c for c in previous.get("conditions", []) if isinstance(c, dict)}
    before = old.get(kind, {})
    since = before.get("lastTransitionTime") if before.get("status") == status else None
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
    }


def node_status(
    devices: Sequence[pb.Device],
    allocations: Sequence[pb.Allocation],
    *,
    previous: Mapping[str, Any],
    now: str,
    key_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Usage and health, and the ids of the assignment keys hcsd holds (what a key rotation
    waits for, and what the extender's filter checks the signing id against; None, the
    field left out: hcsd does not check assignments); `previous` (the status last written)
    keeps transition times stable."""
    states = {d.uuid: _HEALTH.get(d.health_state, HealthState.HEALTHY) for d in devices}
    healthy = sum(1 for s in states.values() if s is HealthState.HEALTHY)
    schedulable = sum(1 for s in states.values() if s.schedulable)
    total = sum(d.vram_bytes for d in devices)
    allocated = sum(min(d.vram_allocated_bytes, d.vram_bytes) for d in devices)
    devices = [published(d) for d in devices]  # the rating the spec shows
    acu_total = sum(acu(d.tflops_fp16) for d in devices)
    # A device's reserved compute share, as ComputeQuota counts TFLOPS (100 for whole devices,
    # 0 for a VRAM-only slice).
    acu_allocated = sum(
        acu(d.tflops_fp16) * min(d.compute_allocated_percent, 100) / 100 for d in devices
    )
    bad = sorted(
        f"{d.uuid} {states[d.uuid].value}" for d in devices if not states[d.uuid].schedulable
    )
    # every device not healthy, with why in stable words (no figures: no write per reading)
    not_healthy = "; ".join(
        sorted(why(d, states[d.uuid]) for d in devices if states[d.uuid] is not HealthState.HEALTHY)
    )[:MESSAGE_MAX]
    if not devices:
        phase, ready_reason, ready_message = "NotReady", "NoDevices", "hcsd found no accelerators"
    elif schedulable == 0:
        phase, ready_reason, ready_message = "NotReady", "NoHealthyDevices", not_healthy
    elif bad or healthy < len(devices):
        phase, ready_reason, ready_message = "Degraded", "SomeDevicesUnhealthy", not_healthy
    else:
        phase, ready_reason, ready_message = "Ready", "AllDevicesHealthy", ""
    return {
        "phase": phase,
        "vendors": ",".join(sorted({d.vendor for d in devices})),
        "deviceCount": len(devices),
        "healthyDevices": healthy,
        "health": f"{healthy}/{len(devices)}",
        "vramTotalBytes": total,
        "vramAllocatedBytes": allocated,
        "vramTotal": format_bytes(total),
        "vramFree": format_bytes(total - allocated),
        "vramAllocated": format_bytes(allocated),
        "unhealthyDevices": len(devices) - healthy,
        "acuTotal": round(acu_total, 1),
        "acuAllocated": round(acu_allocated, 1),
        **({} if key_ids is None else {"assignmentKeys": sorted(key_ids)}),
        **node_subhealth(devices),
        "conditions": [
            _condition(
                "Ready", schedulable > 0, ready_reason, ready_message, previous=previous, now=now
            ),
            _condition(
                "HardwareHealthy",
                healthy == len(devices),
                "AllDevicesHealthy" if healthy == len(devices) else "DevicesNotHealthy",
                "; ".join(bad)
                or (f"{len(devices) - healthy} degraded" if healthy < len(devices) else ""),
                previous=previous,
                now=now,
            ),
        ],
        "devices": [
            {
                "uuid": d.uuid,
                "health": states[d.uuid].value,
                "healthScore": d.health_score,
                "vramAllocatedBytes": d.vram_allocated_bytes,
                "computeAllocated": d.compute_allocated_percent,
                "holders": d.allocation_count,
                # why it is not healthy: the device's health_reason (its latest health event,
                # an Xid, an AER error, a slow device; or "removed from the bus")
                **device_reason(d, states[d.uuid]),
                **device_subhealth(d),
            }
            for d in sorted(devices, key=lambda d: (d.vendor, d.index, d.uuid))
        ],
        "allocations": [
            {
                "containerID": a.container_id,
                "podUID": a.pod.uid,
                "namespace": a.pod.namespace,
                "pod": a.pod.name,
                "container": a.container_name,
                "source": a.source,
                "grants": [
                    {"uuid": g.device_uuid, "vramBytes": g.vram_bytes, "compute": g.compute_percent}
                    for g in a.grants
                ],
            }
            for a in sorted(allocations, key=lambda a: a.container_id)
        ],
    }


def compute_node(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A new ComputeNode object (the status is written through its subresource after)."""
    return {
        "apiVersion": API_VERSION,
        "kind": COMPUTE_NODE_KIND,
        "metadata": {"name": name, "labels": {NODE_LABEL: name}},
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class PodHold:
    """What one pod's container holds on a node: from hcsd's allocations or an assignment."""

    pod_uid: str
    container: str
    namespace: str
    grants: tuple[Grant, ...]

    @property
    def key(self) -> str:
        return f"{self.pod_uid}/{self.container}"


@dataclass(frozen=True, slots=True)
class NodeView:
    """One ComputeNode as the extender schedules on it: model devices, and who holds what."""

    name: str
    devices: tuple[Device, ...]
    holds: Mapping[str, PodHold]  # by "pod-uid/container"
    local_usage: Mapping[str, Usage]  # allocations without a pod (hcsctl, local requests)
    phase: str
    generation: str = ""  # resourceVersion: a cheap "did anything change"
    models: frozenset[str] = field(default_factory=frozenset)
    key_ids: frozenset[str] | None = None  # status.assignmentKeys; None: not reported
    fabric: str = ""  # spec.fabric.domain: the RDMA fabric domain; "": none reported
    mode: str = MODE_EXTENDER  # label hcs.io/mode: dra, its devices go through ResourceSlices

    @property
    def offered(self) -> bool:
        """Whether the extender may place pods here: Ready or Degraded, and in extender mode
        (a DRA-mode node's devices are kube-scheduler's to allocate, never both)."""
        return self.phase != "NotReady" and self.mode != MODE_DRA

    def usage(self, extra: Iterable[PodHold] = ()) -> dict[str, Usage]:
        """Per-device usage from holds, local allocations and `extra` (assumed, not yet seen)."""
        vram: dict[str, int] = {u: x.vram_bytes for u, x in self.local_usage.items()}
        compute: dict[str, int] = {u: x.compute_percent for u, x in self.local_usage.items()}
        for hold in (*self.holds.values(), *extra):
            for grant in hold.grants:
                vram[grant.device_uuid] = vram.get(grant.device_uuid, 0) + grant.vram_bytes
                compute[grant.device_uuid] = (
                    compute.get(grant.device_uuid, 0) + grant.compute_percent
                )
        return {u: Usage(vram[u], min(compute.get(u, 0), 100)) for u in vram}


class ObjectError(ValueError):
    """A ComputeNode that does not have the shape the CRD schema promises."""


MAX_DEVICE_VRAM = 1 << 46  # 64 TiB: a device reporting more is a broken report, not a device


def _vram(raw: Mapping[str, Any]) -> int:
    vram = int(raw["vramBytes"])
    if not 0 <= vram <= MAX_DEVICE_VRAM:
        raise ValueError(f"vramBytes {vram} is outside 0..{MAX_DEVICE_VRAM}")
    return vram


# The health score the extender sees for a device that hcs-controller found slow against its
# model's fleet median (status.fleet): it still takes work, after the devices that are not.
SLOW_SCORE = 50


def _device(raw: Mapping[str, Any], health: Mapping[str, Any], *, slow: bool = False) -> Device:
    links = tuple(
        Link(str(link["peer"]), LinkKind(str(link["kind"])), float(link.get("gbps", 0.0)))
        for link in raw.get("links") or ()
    )
    state = HealthState(str(health.get("health", "healthy")))
    return Device(
        uuid=str(raw["uuid"]),
        vendor=Vendor.parse(str(raw["vendor"])),
        model=str(raw["model"]),
        index=int(raw.get("index", 0)),
        pci_bus_id=str(raw.get("pciBusID", "")),
        vram_bytes=_vram(raw),
        numa_node=int(raw.get("numaNode", -1)),
        tflops_fp16=float(raw.get("tflopsFP16", 0.0)),
        tflops_bf16=float(raw.get("tflopsBF16", 0.0)),
        tflops_fp32=float(raw.get("tflopsFP32", 0.0)),
        tops_int8=float(raw.get("topsINT8", 0.0)),
        links=links,
        health_score=min(int(health.get("healthScore", 100)), SLOW_SCORE if slow else 100),
        health_state=state,
    )


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """Read a ComputeNode; ObjectError when it is not what the schema promises."""
    try:
        name = str(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        health = {str(d["uuid"]): d for d in status.get("devices") or ()}
        slow = {str(d["uuid"]) for d in (status.get("fleet") or {}).get("slowDevices") or ()}
        devices = tuple(
            _device(d, health.get(str(d["uuid"]), {}), slow=str(d["uuid"]) in slow)
            for d in spec.get("devices") or ()
        )
        holds: dict[str, PodHold] = {}
        local: dict[str, Usage] = {}
        for a in status.get("allocations") or ():
            grants = tuple(
                Grant(str(g["uuid"]), int(g["vramBytes"]), int(g.get("compute", 0)))
                for g in a.get("grants") or ()
            )
            uid = str(a.get("podUID") or "")
            if uid:
                hold = PodHold(
                    uid, str(a.get("container", "")), str(a.get("namespace", "")), grants
                )
                holds[hold.key] = hold
            else:
                for g in grants:
                    old = local.get(g.device_uuid, Usage())
                    local[g.device_uuid] = Usage(
                        old.vram_bytes + g.vram_bytes, old.compute_percent + g.compute_percent
                    )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ObjectError(f"ComputeNode {obj.get('metadata', {}).get('name')!r}: {e!r}") from e
    return NodeView(
        name=name,
        devices=devices,
        holds=holds,
        local_usage=local,
        phase=str(status.get("phase", "NotReady")) if status else "NotReady",
        generation=str(obj.get("metadata", {}).get("resourceVersion", "")),
        models=frozenset(d.model.lower() for d in devices),
        key_ids=_key_ids(status),
        fabric=str((spec.get("fabric") or {}).get("domain") or ""),
        mode=str(
            ((obj.get("metadata") or {}).get("labels") or {}).get(MODE_LABEL) or MODE_EXTENDER
        ),
    )


def _key_ids(status: Mapping[str, Any]) -> frozenset[str] | None:
    """The key ids hcsd holds, as its syncer reported them; None when not reported (an older
    syncer), which the filter does not hold against the node."""
    ids = status.get("assignmentKeys")
    if not isinstance(ids, list):
        return None
    return frozenset(str(kid) for kid in ids)
