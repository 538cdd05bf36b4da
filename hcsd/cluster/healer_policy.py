"""What hcs-controller decides, as pure functions over API objects (no I/O, no clock).

A ComputeNode says which devices are unhealthy, lost or degraded (its status, written by the
node's hcs-syncer) and which the fleet found slow (`status.fleet`, written by the controller:
see `healer_fleet`). From that and the pods that hold the devices, the controller decides
which pods to isolate and whether the Node carries the taint. Kept apart from the loop that
acts on it so that every rule is a table in tests/unit/test_healer_policy.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.contract import assignment
from hcsd.contract.names import (
    ANNOTATION_ASSIGNMENT,
    ANNOTATION_EVICTION,
    EVICTION_NEVER,
    REASON_DEVICE_DEGRADED,
    REASON_DEVICE_FAILED,
)

__all__ = [
    "Fault",
    "PodRef",
    "Policy",
    "Target",
    "device_count",
    "ended",
    "faults",
    "holders",
    "opted_out",
    "pod_ref",
    "should_taint",
]

TAINT_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's choices (hcs-controller's flags, the chart's `controller` values)."""

    # Taint the Node when all its devices are bad, or more than this share of them (1.0:
    # only all of them).
    taint_share: float = 1.0
    taint_effect: str = "NoSchedule"  # or NoExecute: the taint manager then deletes the rest
    # The Node's devices must have been good this long before the taint goes.
    quiet_seconds: float = 300.0  # as the chart's controller.quietSeconds
    # deleteOptions.gracePeriodSeconds of the eviction; None: each pod's own.
    grace_seconds: int | None = None
    # Degraded devices (hcsd's `degraded`, or slow against the fleet) are isolated like
    # failed ones: their pods evicted, counted towards the taint.
    isolate_degraded: bool = False

    def __post_init__(self) -> None:
        if self.taint_effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taint effect must be one of {TAINT_EFFECTS}, not {self.taint_effect}"
            )
        if not 0.0 < self.taint_share <= 1.0:
            raise ValueError(f"taint share must be in (0, 1], not {self.taint_share}")


@dataclass(frozen=True, slots=True)
class Fault:
    """Why one device is isolated: `reason` is the pod condition's, `message` names it."""

    uuid: str
    state: str  # unhealthy, lost, degraded, slow
    reason: str
    message: str


def faults(node: Mapping[str, Any], policy: Policy) -> dict[str, Fault]:
    """The node's devices to isolate, by uuid: unhealthy or lost always; degraded (by hcsd)
    or slow (by the fleet) when the policy says so."""
    name = str((node.get("metadata") or {}).get("name", ""))
    status = node.get("status") or {}
    found: dict[str, Fault] = {}
    for device in status.get("devices") or ():
        uuid, state = str(device.get("uuid", "")), str(device.get("health", "healthy"))
        # hcsd's reason, else the sub-health signals that hold the device degraded
        why = str(device.get("reason") or ", ".join(map(str, device.get("subhealth") or ())))
        if state in ("unhealthy", "lost"):
            found[uuid] = Fault(uuid, state, REASON_DEVICE_FAILED, _message(uuid, name, state, why))
        elif state == "degraded" and policy.isolate_degraded:
            found[uuid] = Fault(
                uuid, state, REASON_DEVICE_DEGRADED, _message(uuid, name, state, why)
            )
    if policy.isolate_degraded:
        for slow in (status.get("fleet") or {}).get("slowDevices") or ():
            uuid = str(slow.get("uuid", ""))
            if uuid and uuid not in found:
                why = str(slow.get("reason") or "")
                found[uuid] = Fault(
                    uuid, "slow", REASON_DEVICE_DEGRADED, _message(uuid, name, "slow", why)
                )
    return found


def _message(uuid: str, node: str, state: str, why: str) -> str:
    return f"device {uuid} on node {node} is {state}" + (f": {why}" if why else "")[:600]


def device_count(node: Mapping[str, Any]) -> int:
    return len((node.get("spec") or {}).get("devices") or ())


def should_taint(node: Mapping[str, Any], bad: int, policy: Policy) -> bool:
    """All the node's devices bad, or more than the policy's share of them."""
    total = device_count(node)
    return total > 0 and (bad >= total or bad / total > policy.taint_share)


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod that holds devices, as the pods informer keeps it."""

    uid: str
    namespace: str
    name: str
    node: str
    devices: frozenset[str]


def ended(obj: Mapping[str, Any]) -> bool:
    """The pod's containers have stopped for good (Succeeded, Failed): it holds no device."""
    return (obj.get("status") or {}).get("phase", "") in ("Succeeded", "Failed")


def pod_ref(obj: Mapping[str, Any]) -> PodRef | None:
    """A bound, running pod whose `hcs.io/assignment` names devices, else None.

    The signature is not checked (the controller holds no key): an assignment anyone wrote
    can only get the pod that carries it evicted, which whoever can edit the pod can do
    anyway. It must name this pod's uid and node (a copied annotation names another)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    text = annotations.get(ANNOTATION_ASSIGNMENT)
    node = str((obj.get("spec") or {}).get("nodeName") or "")
    if not text or not node or ended(obj) or meta.get("deletionTimestamp"):
        return None
    uid = str(meta.get("uid") or "")
    try:
        parsed = assignment.parse(text)
        assignment.check_bound(parsed, node=node, pod_uid=uid)
    except assignment.AssignmentError as e:
        raise ValueError(str(e)) from e
    devices = frozenset(g.device_uuid for grants in parsed.containers.values() for g in grants)
    return PodRef(
        uid,
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        node,
        devices,
    )


def opted_out(annotations: Mapping[str, Any]) -> bool:
    return str(annotations.get(ANNOTATION_EVICTION, "")).strip().lower() == EVICTION_NEVER


@dataclass(frozen=True, slots=True)
class Target:
    """A pod to isolate: who it is, and the faults of the devices it holds."""

    namespace: str
    name: str
    uid: str
    faults: tuple[Fault, ...]
    node: str = ""  # the ComputeNode that named it: the pod must be bound there

    def bound_here(self, pod: Mapping[str, Any]) -> bool:
        """The pod read back is this one (uid) and bound to the node that reported it. A
        ComputeNode's status is written by that node (its syncer's credentials, so root
        on it): its allocations may name any pod in the cluster, and only the pods bound
        to it are its business."""
        meta = pod.get("metadata") or {}
        bound = str((pod.get("spec") or {}).get("nodeName") or "")
        return meta.get("uid") == self.uid and bool(self.node) and bound == self.node

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def holders(
    node: Mapping[str, Any], pods: Iterable[PodRef], bad: Mapping[str, Fault]
) -> list[Target]:
    """The pods holding any of the `bad` devices on this node: by their assignment (bound,
    maybe not started yet) and by hcsd's allocations in the ComputeNode status (started,
    also pods placed without an assignment). The node writes its own status, so an
    allocation naming a pod known to be bound elsewhere is ignored (and every target is
    read back and checked against `Target.bound_here` before anything is done to it)."""
    name = str((node.get("metadata") or {}).get("name", ""))
    found: dict[str, tuple[str, str, set[str]]] = {}  # uid -> namespace, name, uuids
    elsewhere: set[str] = set()
    for pod in pods:
        if pod.node != name:
            elsewhere.add(pod.uid)
        else:
            hit = pod.devices & bad.keys()
            if hit:
                found.setdefault(pod.uid, (pod.namespace, pod.name, set()))[2].update(hit)
    for allocation in (node.get("status") or {}).get("allocations") or ():
        uid = str(allocation.get("podUID") or "")
        uuids = {str(g.get("uuid")) for g in allocation.get("grants") or ()} & bad.keys()
        if uid and uuids and uid not in elsewhere:
            entry: tuple[str, str, set[str]] = (
                str(allocation.get("namespace", "")),
                str(allocation.get("pod", "")),
                set(),
            )
            found.setdefault(uid, entry)[2].update(uuids)
    return [
        Target(namespace, pod, uid, tuple(bad[u] for u in sorted(uuids)), name)
        for uid, (namespace, pod, uuids) in sorted(found.items())
    ]
