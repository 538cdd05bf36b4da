"""The API calls hcs-controller makes, one function each, and nothing else.

Each is exactly one RBAC rule of packaging/helm/hcs/templates/rbac-controller.yaml: get a pod,
patch pods/status (the DisruptionTarget condition), create pods/eviction, patch nodes (our
taint only: a JSON patch of its own entry, guarded by a test, so other taints are never
written; the Node is read from the answer to an empty patch, as get is not granted), patch
computenodes/status (`status.fleet`), create events. The Events it may write are the two
tables below, which admission-controller.yaml's policy on events repeats (a test compares them).
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping
from typing import Any

from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.timefmt import rfc3339
from hcsd.contract.names import (
    API_VERSION,
    COMPUTE_NODE_KIND,
    COMPUTE_NODES,
    REASON_DEVICE_DEGRADED,
    REASON_DEVICE_FAILED,
    TAINT_UNHEALTHY,
)

__all__ = [
    "COMPUTE_NODE_EVENTS",
    "EVENT_NAMESPACE",
    "POD_EVENTS",
    "Eviction",
    "compute_node_ref",
    "evict",
    "get_pod",
    "has_condition",
    "post_event",
    "set_condition",
    "set_taint",
    "taint_of",
    "write_fleet",
]

STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
DISRUPTION_TARGET = "DisruptionTarget"
# Events about cluster-scoped objects (ComputeNodes) live here, as the Node's do.
EVENT_NAMESPACE = "default"
COMPONENT = "hcs-controller"
#: The reasons of the Events on a pod: why it goes (the device's fault), evicted, or not
#: (a PodDisruptionBudget refused, for now; the pod opted out).
POD_EVENTS = frozenset(
    {REASON_DEVICE_FAILED, REASON_DEVICE_DEGRADED, "Evicted", "EvictionBlocked", "EvictionSkipped"}
)
#: The reasons of the Events on a ComputeNode: what was done about its pods, its Node's taint,
#: its devices' standing against the fleet.
COMPUTE_NODE_EVENTS = frozenset(
    {
        "PodEvicted",
        "PodEvictionBlocked",
        "PodEvictionSkipped",
        "NodeTainted",
        "NodeUntainted",
        "SlowDevices",
        "SlowDevicesCleared",
    }
)


def pod_path(namespace: str, name: str) -> str:
    return paths_for("v1", "pods", namespace, name)


def get_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return kube.get(pod_path(namespace, name))
    except KubeError as e:
        if e.not_found:
            return None
        raise


def has_condition(pod: Mapping[str, Any], reason: str) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
            return bool(condition.get("reason") == reason)
    return False


def set_condition(kube: Kube, pod: Mapping[str, Any], reason: str, message: str) -> None:
    """DisruptionTarget=True with our reason, merged by type into the pod's conditions (a
    strategic merge: the kubelet's own conditions stay as they are)."""
    meta = pod.get("metadata") or {}
    condition = {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(time.time()),
    }
    kube.request(
        "PATCH",
        pod_path(str(meta.get("namespace")), str(meta.get("name"))) + "/status",
        body={"metadata": {"uid": meta.get("uid")}, "status": {"conditions": [condition]}},
        content_type=STRATEGIC,
    )


class Eviction(enum.Enum):
    EVICTED = "evicted"
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget allows no disruption now
    GONE = "gone"  # the pod (that uid) no longer exists
    THROTTLED = "throttled"  # not asked: over the controller's evictions a minute


def evict(kube: Kube, pod: Mapping[str, Any], grace: int | None) -> Eviction:
    """Ask the Eviction API (policy/v1) to delete the pod, for this uid only; PDBs apply."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    options: dict[str, Any] = {"preconditions": {"uid": meta.get("uid")}}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": options,
    }
    try:
        kube.create(pod_path(namespace, name) + "/eviction", body)
    except KubeError as e:
        if e.status == 429:
            return Eviction.BLOCKED
        if e.not_found or e.conflict:  # 409: the uid precondition failed, another pod now
            return Eviction.GONE
        raise
    return Eviction.EVICTED


def _ours(node: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The index and effect of our taint on the Node (None, None: it has none)."""
    for index, taint in enumerate((node.get("spec") or {}).get("taints") or ()):
        if taint.get("key") == TAINT_UNHEALTHY:
            return index, str(taint.get("effect", ""))
    return None, None


def _node(kube: Kube, node: str) -> dict[str, Any]:
    """The Node, from the answer to an empty patch, which writes nothing: the controller may
    patch Nodes, not read them."""
    return kube.patch(paths_for("v1", "nodes", name=node), {})


def taint_of(kube: Kube, node: str) -> str | None:
    """The effect of our taint on the Node, None when it has none."""
    return _ours(_node(kube, node))[1]


def set_taint(kube: Kube, node: str, effect: str | None) -> str | None:
    """Put our taint on the Node with `effect`, or take it off (None); the effect it carries
    after the call. A JSON patch of our entry alone (Node taints have no merge key: a
    strategic merge would replace the whole list), each step guarded by a `test` of what it
    changes, so a concurrent edit of the taints fails the patch (422, retried next round)
    instead of being lost."""
    current = _node(kube, node)
    index, have = _ours(current)
    if have == effect:
        return have
    taint: dict[str, Any] = {"key": TAINT_UNHEALTHY, "effect": effect}
    if effect == "NoExecute":
        taint["timeAdded"] = rfc3339(time.time())
    where = f"/spec/taints/{index}"
    ops: list[dict[str, Any]]
    if index is not None:
        guard = {"op": "test", "path": f"{where}/key", "value": TAINT_UNHEALTHY}
        change = {"op": "remove", "path": where} if effect is None else {
            "op": "replace", "path": where, "value": taint}  # fmt: skip
        ops = [guard, change]
    elif (current.get("spec") or {}).get("taints"):
        ops = [{"op": "add", "path": "/spec/taints/-", "value": taint}]
    else:  # no list yet: only if nobody wrote one meanwhile
        version = (current.get("metadata") or {}).get("resourceVersion")
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/spec/taints", "value": [taint]},
        ]
    answer = kube.request(
        "PATCH", paths_for("v1", "nodes", name=node), body=ops, content_type=JSON_PATCH
    )
    return _ours(answer)[1]


def write_fleet(kube: Kube, node: str, fleet: Mapping[str, Any] | None) -> None:
    """`status.fleet` of the ComputeNode (None removes it), through the status subresource."""
    kube.patch(
        paths_for(API_VERSION, COMPUTE_NODES, name=node) + "/status", {"status": {"fleet": fleet}}
    )


def post_event(
    kube: Kube,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    warning: bool = True,
) -> None:
    """A core/v1 Event about `involved` (a pod, or a ComputeNode: in EVENT_NAMESPACE), as
    `kubectl describe` shows them. A reason outside the tables is a bug here, refused before
    the admission policy would refuse it."""
    kind = involved.get("kind", "Pod")
    if reason not in (COMPUTE_NODE_EVENTS if kind == COMPUTE_NODE_KIND else POD_EVENTS):
        raise ValueError(f"no {kind} Event has the reason {reason!r} (healer_actions' tables)")
    meta = involved.get("metadata") or {}
    namespace = str(meta.get("namespace") or EVENT_NAMESPACE)
    stamp = rfc3339(time.time())
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": kind,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": os.environ.get("POD_NAME", COMPONENT),
        "action": reason,
    }
    kube.create(paths_for("v1", "events", namespace), body)


def compute_node_ref(name: str, uid: str = "") -> dict[str, Any]:
    """What `post_event` needs of a ComputeNode."""
    return {
        "apiVersion": API_VERSION,
        "kind": COMPUTE_NODE_KIND,
        "metadata": {"name": name, "uid": uid},
    }
