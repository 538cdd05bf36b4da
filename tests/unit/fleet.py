"""ComputeNodes, Leases and pods for the extender's unit tests, built with the syncer's own
functions and delivered through the informers' `apply`, as watch events are."""

from __future__ import annotations

import time
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.extender import Extender
from hcsd.cluster.heartbeats import NodeLease
from hcsd.cluster.holds import PodInfo
from hcsd.cluster.objects import PodHold, compute_node, node_spec, node_status, node_view
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.names import NAMESPACE, NODE_LEASE_PREFIX
from hcsd.model import Grant

GiB = 2**30


def node_object(
    name: str,
    *,
    count: int = 2,
    vram_gib: int = 80,
    health: int = pb.HEALTH_STATE_HEALTHY,
    allocated: dict[int, tuple[str, int]] | None = None,
    version: int = 1,
    key_ids: list[str] | None = None,
) -> dict[str, Any]:
    """A ComputeNode of `count` A100s; `allocated` maps a device index to (pod uid, GiB) as
    hcsd would report it; `key_ids`, the assignment keys its hcsd reports (None: not
    reported)."""
    devices = [pb.Device(uuid=f"{name}-{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                         vram_bytes=vram_gib * GiB, tflops_fp16=312, health_score=100,
                         health_state=health)
               for i in range(count)]  # fmt: skip
    allocations = []
    for index, (uid, gib) in (allocated or {}).items():
        devices[index].vram_allocated_bytes = gib * GiB
        allocations.append(pb.Allocation(
            container_id=f"{uid}-c", pod=pb.PodRef(namespace="ns", name=uid, uid=uid),
            container_name="main", source="assignment",
            grants=[pb.Grant(device_uuid=f"{name}-{index}", vram_bytes=gib * GiB)]))  # fmt: skip
    obj = compute_node(name, node_spec(pb.Node(name=name, version="0.1.0"), devices))
    obj["status"] = node_status(
        devices, allocations, previous={}, now="2026-01-01T00:00:00Z", key_ids=key_ids
    )
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


def add_node(extender: Extender, name: str, **kwargs: Any) -> None:
    extender.state.nodes.apply(name, node_view(node_object(name, **kwargs)))


def beat(extender: Extender, name: str, *, age: float = 0.0, duration: float = 40.0) -> None:
    """The node's heartbeat Lease renewed `age` seconds ago, as the leases informer sees it."""
    lease = NodeLease(name, micro_time(time.time() - age), duration)
    extender.state.leases.apply(f"{NAMESPACE}/{NODE_LEASE_PREFIX}{name}", lease)


def assigned(uid: str, node: str, *grants: tuple[int, int], namespace: str = "ns") -> PodInfo:
    """A pod the pods informer shows with an assignment: (device index, GiB) per grant."""
    hold = PodHold(
        uid, "main", namespace, tuple(Grant(f"{node}-{i}", gib * GiB, 0) for i, gib in grants)
    )
    return PodInfo(uid, namespace, uid, node, (hold,))


def pod(limits: dict[str, str], *, uid: str = "u1", namespace: str = "ns",
        annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": uid, "namespace": namespace, "uid": uid,
                     "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }  # fmt: skip
