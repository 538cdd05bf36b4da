"""Which RuntimeProfile entry a gated pod runs with in DRA mode, from the free capacity the
ResourceSlices publish (pure: objects in, a Choice or a sentence out).

The pod's claim template lists, per container request, the alternatives the webhook wrote
(claim_shapes, read back with `selected`), best first. The choice follows the same order:
the first alternative of the first request, then the next; within an alternative, the
profile's entries in the profile's order. An entry is chosen when some node has, for every
request, enough free devices that the entry admits and the alternative selects (the devices
not tainted, with the memory and compute share still unconsumed by allocated claims). The
pod is then limited to every node with a device of that entry (not only those with room now:
kube-scheduler decides among them, and a pod that waits for room waits as any pod does).

kube-scheduler remains the one that allocates: this is a forecast from the same published
numbers, which another pod may consume first (the pod then stays Pending with
kube-scheduler's own FailedScheduling reason, like any pod whose claim does not fit).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.claim_shapes import Selected
from hcsd.cluster.demand import Cover
from hcsd.contract.dra import ATTR_MODEL, ATTR_VENDOR, CAPACITY_COMPUTE, CAPACITY_MEMORY, DRIVER
from hcsd.quantity import parse_bytes

log = logging.getLogger(__name__)

__all__ = ["Choice", "FreeDevice", "choose", "free_devices"]


@dataclass(frozen=True, slots=True)
class FreeDevice:
    node: str
    name: str
    vendor: str
    model: str
    memory: int  # bytes the device has
    memory_free: int
    compute_free: int  # percent
    tainted: bool


@dataclass(frozen=True, slots=True)
class Choice:
    entry: int  # index into the profile's entries (and the cover's)
    nodes: tuple[str, ...]  # every node with a device of that entry, sorted


def _attribute(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(value.get("string") or "")


def _consumed(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    """(pool, device) -> (memory bytes, compute percent) the allocated claims consume; a
    result that says nothing consumed the whole device (-1)."""
    used: dict[tuple[str, str], tuple[int, int]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != DRIVER:
                continue
            key = (str(result.get("pool")), str(result.get("device")))
            capacity = result.get("consumedCapacity")
            if not capacity:
                used[key] = (-1, -1)
                continue
            try:
                memory = parse_bytes(str(capacity.get(CAPACITY_MEMORY, "0")))
                compute = int(str(capacity.get(CAPACITY_COMPUTE, "0")))
            except (ValueError, TypeError, AttributeError) as e:  # unreadable: all of it taken
                log.warning("device %s/%s: a consumed capacity that cannot be read (%s): "
                            "counted as the whole device", *key, e)  # fmt: skip
                used[key] = (-1, -1)
                continue
            old = used.get(key, (0, 0))
            if old[0] >= 0:
                used[key] = (old[0] + memory, old[1] + compute)
    return used


def free_devices(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
) -> list[FreeDevice]:
    """Every device of this driver's slices with what the allocated claims left of it."""
    used = _consumed(claims)
    found = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != DRIVER or not spec.get("nodeName"):
            continue
        pool = str((spec.get("pool") or {}).get("name"))
        for device in spec.get("devices") or ():
            try:
                capacity = device.get("capacity") or {}
                memory = parse_bytes(str((capacity.get(CAPACITY_MEMORY) or {}).get("value", "0")))
            except (ValueError, TypeError, AttributeError) as e:
                log.warning("ResourceSlice of %s: a device whose memory cannot be read (%s): "
                            "left out", spec.get("nodeName"), e)  # fmt: skip
                continue
            taken_memory, taken_compute = used.get((pool, str(device.get("name"))), (0, 0))
            if taken_memory < 0:  # whole device
                taken_memory, taken_compute = memory, 100
            found.append(
                FreeDevice(
                    node=str(spec["nodeName"]),
                    name=str(device.get("name")),
                    vendor=_attribute(device, ATTR_VENDOR),
                    model=_attribute(device, ATTR_MODEL),
                    memory=memory,
                    memory_free=memory - taken_memory,
                    compute_free=100 - taken_compute,
                    tainted=any(
                        t.get("effect") in ("NoSchedule", "NoExecute")
                        for t in device.get("taints") or ()
                    ),
                )
            )
    return found


def _fits(device: FreeDevice, alternative: Selected) -> bool:
    if device.tainted:
        return False
    if alternative.vendors and device.vendor not in alternative.vendors:
        return False
    if alternative.models and device.model.lower() not in alternative.models:
        return False
    if alternative.memory is None:  # whole devices
        return device.memory_free == device.memory and device.compute_free == 100
    return device.memory_free >= alternative.memory and device.compute_free >= alternative.compute


def _room(devices: Sequence[FreeDevice], request: Sequence[Selected]) -> bool:
    """Whether some alternative of the request finds its count of devices among `devices`."""
    return any(sum(_fits(d, a) for d in devices) >= a.count for a in request)


def choose(
    requests: Sequence[Sequence[Selected]], cover: Cover, devices: Sequence[FreeDevice]
) -> Choice | str:
    """The entry and nodes for a pod whose claim asks `requests` (per container request, its
    alternatives best first), or why none has room now (the pod stays gated)."""
    if not requests or not requests[0]:
        return "its claim template asks for no devices"
    by_entry: dict[int, dict[str, list[FreeDevice]]] = {}
    for device in devices:
        entry = cover.entry_for(device.vendor, device.model)
        if entry is not None:
            by_entry.setdefault(entry, {}).setdefault(device.node, []).append(device)
    for alternative in requests[0]:
        for entry in range(len(cover.entries)):
            nodes = by_entry.get(entry, {})
            room = [
                node
                for node, held in nodes.items()
                if _room(held, [alternative]) and all(_room(held, r) for r in requests[1:])
            ]
            if room:
                return Choice(entry, tuple(sorted(nodes)))
    if not by_entry:
        return f"no node publishes a device runtime profile {cover.profile} has an image for"
    return (
        f"no node has room now for the claim on a device runtime profile {cover.profile} "
        "has an image for; waiting for capacity"
    )
