"""The cluster as people ask about it: capacity per vendor and model, sick devices, pods waiting
for accelerators and ComputeQuota usage, from the objects the API server holds.

Pure functions over plain dicts (ComputeNodes, pods, ComputeQuotas as listed), so the figures
are tested without a cluster; `cluster_reader` lists the objects, `hcsd.cli.cluster` renders.
Read defensively: one malformed object is left out and named in `problems`, never the view.

Capacity counts what the scheduler can use, by its own rules: a node whose heartbeat Lease is
stale (or missing, or whose status was never written) is `stale` and counted apart, by the
extender's `stale_reason`; a device that is not `schedulable` (unhealthy, lost; degraded
still takes work) counts in `unusable`, never in free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hcsd.cluster.heartbeats import Heartbeats, node_lease, stale_reason
from hcsd.cluster.objects import ObjectError, acu, node_view
from hcsd.contract.names import ANNOTATION_ASSIGNMENT, GROUP, MANAGED_RESOURCES, QUOTA_KEYS
from hcsd.model import HealthState

__all__ = [
    "HCS_SCHEDULER",
    "ClusterView",
    "ModelSummary",
    "PendingPod",
    "QuotaUsage",
    "SickDevice",
    "Source",
    "StaleNode",
    "is_accelerator_pod",
    "summarise",
    "totals",
]

HCS_SCHEDULER = "hcs-scheduler"  # the scheduler profile that calls the extender


@dataclass(slots=True)
class ModelSummary:
    """All devices of one vendor and model across the cluster."""

    vendor: str
    model: str
    nodes: set[str] = field(default_factory=set)
    devices: int = 0
    not_healthy: int = 0
    vram_total: int = 0  # every device's, schedulable or not
    vram_used: int = 0
    acu_total: float = 0.0
    acu_used: float = 0.0
    measured: int = 0  # devices whose figures were measured on their node; the rest: profile
    unusable: int = 0  # devices the scheduler does not use (unhealthy, lost)
    unusable_vram: int = 0  # their VRAM and ACU, in the totals above, never in free
    unusable_vram_used: int = 0
    unusable_acu: float = 0.0
    unusable_acu_used: float = 0.0

    @property
    def vram_free(self) -> int:
        """Free on the devices the scheduler uses."""
        usable = self.vram_total - self.unusable_vram
        return max(usable - (self.vram_used - self.unusable_vram_used), 0)

    @property
    def acu_free(self) -> float:
        usable = self.acu_total - self.unusable_acu
        return max(usable - (self.acu_used - self.unusable_acu_used), 0.0)

    def add(self, other: ModelSummary) -> None:
        """Count `other`'s devices in too (for totals)."""
        self.nodes |= other.nodes
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acu_source(self) -> str:
        """`profile`, `measured`, or `measured 1/2` when only some devices were measured."""
        if self.measured == 0:
            return "profile"
        if self.measured == self.devices:
            return "measured"
        return f"measured {self.measured}/{self.devices}"


_COUNTS = (
    "devices", "not_healthy", "vram_total", "vram_used", "acu_total", "acu_used", "measured",
    "unusable", "unusable_vram", "unusable_vram_used", "unusable_acu", "unusable_acu_used",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StaleNode:
    """A node the scheduler does not use whatever its devices say: why, and what it has."""

    name: str
    reason: str
    capacity: ModelSummary


@dataclass(frozen=True, slots=True)
class SickDevice:
    node: str
    uuid: str
    vendor: str
    index: int
    model: str
    health: str  # degraded, unhealthy, lost
    score: int
    reason: str


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    asks: Mapping[str, str]  # ai.compute/* limits, summed over containers where they add up
    scheduler: str
    node: str  # set when bound but not started yet
    reason: str  # PodScheduled's reason (Unschedulable, SchedulerError), else the phase's
    message: str  # the scheduler's message: the extender's refusal for each node
    created: str


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    namespace: str
    name: str
    hard: Mapping[str, str]
    used: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Source:
    """Where the view was read from, for the first line of the table and the JSON."""

    server: str
    kubeconfig: str  # "" in a pod (its service account)
    context: str


@dataclass(slots=True)
class ClusterView:
    nodes: dict[str, str] = field(default_factory=dict)  # name -> phase ("stale" if stale)
    models: list[ModelSummary] = field(default_factory=list)  # live nodes only
    stale: list[StaleNode] = field(default_factory=list)
    heartbeats_read: bool = True  # False: the Leases could not be read, nothing marked stale
    heartbeats_missing: str = ""  # why not (the RBAC verb lacking)
    pods_missing: str = ""  # why the Pending pods are not shown, when they are not
    namespace: str | None = None  # the Pending pods' namespace; None: all
    sick: list[SickDevice] = field(default_factory=list)
    pending: list[PendingPod] = field(default_factory=list)
    quotas: list[QuotaUsage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # objects left out, and why


def summarise(
    compute_nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    quotas: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] | None = None,
    now: float = 0.0,
) -> ClusterView:
    """The view; `leases` (hcs-system's, None when they could not be read) against wall-clock
    `now` decide which nodes are stale."""
    view = ClusterView(heartbeats_read=leases is not None)
    beats = _heartbeats(leases or (), now)
    models: dict[tuple[str, str], ModelSummary] = {}
    for obj in sorted(compute_nodes, key=lambda o: str(o.get("metadata", {}).get("name"))):
        try:
            name, phase, devices = _read_node(obj)
        except ObjectError as e:
            view.problems.append(str(e))
            continue
        except (ValueError, TypeError, AttributeError) as e:
            view.problems.append(f"ComputeNode {obj.get('metadata', {}).get('name')!r}: {e!r}")
            continue
        stale = None
        if leases is not None:
            stale = stale_reason(beats.beats.get(name), now)
        if stale is None and not obj.get("status"):
            stale = "status never written (is hcs-syncer running on the node?)"
        capacity = ModelSummary("", "")
        for d in devices:
            summary = capacity
            if stale is None:
                summary = models.setdefault((d.vendor, d.model), ModelSummary(d.vendor, d.model))
            _count(summary, name, d)
            if d.sick is not None:
                view.sick.append(d.sick)
        view.nodes[name] = "stale" if stale is not None else phase
        if stale is not None:
            view.stale.append(StaleNode(name, stale, capacity))
    view.models = [models[k] for k in sorted(models)]
    view.sick.sort(key=lambda d: (d.node, d.vendor, d.index, d.uuid))
    view.pending = sorted(
        (_pending(p) for p in pods if _is_pending(p) and is_accelerator_pod(p)),
        key=lambda p: (p.namespace, p.name),
    )
    view.quotas = sorted((_quota(q) for q in quotas), key=lambda q: (q.namespace, q.name))
    return view


def _heartbeats(leases: Iterable[Mapping[str, Any]], now: float) -> Heartbeats:
    """The heartbeats as the extender records them at its first sight of a Lease (by the
    stamp, against this machine's clock): one rule for the scheduler and the view."""
    beats = Heartbeats(lambda: now)
    for obj in leases:
        try:
            lease = node_lease(obj)
        except (TypeError, ValueError, AttributeError):
            continue  # a malformed Lease vouches for nothing: its node reads stale
        if lease is not None:
            beats.record(lease, now)
    return beats


def _count(summary: ModelSummary, node: str, d: _DeviceFigures) -> None:
    summary.nodes.add(node)
    summary.devices += 1
    summary.vram_total += d.vram_total
    summary.vram_used += d.vram_used
    summary.acu_total += d.acu_total
    summary.acu_used += d.acu_used
    summary.measured += d.measured
    summary.not_healthy += d.sick is not None
    if not d.schedulable:
        summary.unusable += 1
        summary.unusable_vram += d.vram_total
        summary.unusable_vram_used += d.vram_used
        summary.unusable_acu += d.acu_total
        summary.unusable_acu_used += d.acu_used


@dataclass(frozen=True, slots=True)
class _DeviceFigures:
    vendor: str
    model: str
    vram_total: int
    vram_used: int
    acu_total: float
    acu_used: float
    measured: bool
    schedulable: bool  # the scheduler's own rule (HealthState.schedulable)
    sick: SickDevice | None


def _read_node(obj: Mapping[str, Any]) -> tuple[str, str, list[_DeviceFigures]]:
    """One ComputeNode's figures, all read before any is counted: a malformed node is left
    out whole, never half counted."""
    node = node_view(obj)  # the extender's reading: the same figures it schedules with
    status = obj.get("status") or {}
    usage = {str(d.get("uuid")): d for d in status.get("devices") or () if isinstance(d, dict)}
    measured = {
        str(d.get("uuid"))
        for d in (obj.get("spec") or {}).get("devices") or ()
        if isinstance(d, dict) and d.get("fingerprint") == "measured"
    }
    figures = []
    for device in node.devices:
        used = usage.get(device.uuid, {})
        device_acu = acu(device.tflops_fp16)
        sick = None
        if device.health_state is not HealthState.HEALTHY:
            sick = SickDevice(
                node.name,
                device.uuid,
                device.vendor.value,
                device.index,
                device.model,
                device.health_state.value,
                device.health_score,
                str(used.get("reason") or ""),
            )
        figures.append(
            _DeviceFigures(
                vendor=device.vendor.value,
                model=device.model,
                vram_total=device.vram_bytes,
                vram_used=min(int(used.get("vramAllocatedBytes", 0)), device.vram_bytes),
                acu_total=device_acu,
                acu_used=device_acu * min(int(used.get("computeAllocated", 0)), 100) / 100,
                measured=device.uuid in measured,
                schedulable=device.health_state.schedulable,
                sick=sick,
            )
        )
    return node.name, node.phase, figures


def _is_pending(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Pending" and not (
        pod.get("metadata") or {}
    ).get("deletionTimestamp")


def is_accelerator_pod(pod: Mapping[str, Any]) -> bool:
    """A pod HCS schedules: it asks for `ai.compute/*`, is for hcs-scheduler, or carries an
    `hcs.io/` annotation (a hint or the assignment)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") == HCS_SCHEDULER or _asks(spec):
        return True
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return any(str(k).startswith(f"{GROUP}/") for k in annotations)


def _asks(spec: Mapping[str, Any]) -> dict[str, str]:
    """The `ai.compute/*` amounts the containers ask, each container's limit (else request)."""
    found: dict[str, list[str]] = {}
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for key in MANAGED_RESOURCES:
            if key in amounts:
                found.setdefault(key, []).append(str(amounts[key]))
    return {key: "+".join(values) for key, values in found.items()}


def _pending(pod: Mapping[str, Any]) -> PendingPod:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    reason, message = "", ""
    for c in status.get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") != "True":
            reason, message = str(c.get("reason", "")), str(c.get("message", ""))
    node = str(spec.get("nodeName") or "")
    if node and not reason:
        reason, message = _waiting(status)
        assigned = ANNOTATION_ASSIGNMENT in (meta.get("annotations") or {})
        message = message or "bound, containers not started yet" + (
            "" if assigned else " (it carries no hcs.io/assignment)"
        )
    return PendingPod(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        asks=_asks(spec),
        scheduler=str(spec.get("schedulerName") or "default-scheduler"),
        node=node,
        reason=reason or "Pending",
        message=message or "not yet looked at by the scheduler",
        created=str(meta.get("creationTimestamp", "")),
    )


def _waiting(status: Mapping[str, Any]) -> tuple[str, str]:
    """Why a bound pod has not started: its first waiting container's reason (hcsd's refusal
    of an assignment shows here, as the runtime's CreateContainerError)."""
    for c in status.get("containerStatuses") or ():
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting:
            return str(waiting.get("reason", "")), str(waiting.get("message", ""))
    return "Bound", ""


def _quota(obj: Mapping[str, Any]) -> QuotaUsage:
    meta = obj.get("metadata") or {}
    hard = (obj.get("spec") or {}).get("hard") or {}
    used = (obj.get("status") or {}).get("used") or {}
    return QuotaUsage(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        hard={k: str(hard[k]) for k in QUOTA_KEYS if k in hard},
        used={k: str(used[k]) for k in QUOTA_KEYS if k in used},
    )


def totals(models: Sequence[ModelSummary]) -> ModelSummary:
    """The cluster's figures over all models."""
    total = ModelSummary("", "")
    for m in models:
        total.add(m)
    return total
