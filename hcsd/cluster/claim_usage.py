"""ComputeQuota in DRA mode: what a namespace's allocated ResourceClaims hold, counted as
the extender counts its pods' grants (compute_quota.py): the memory consumed, the FP16 TFLOPS
of the compute share reserved (a share with none reserved counts 0, a whole device's default
share too), one device per allocated device.

The claims come from kube-scheduler's allocations (`status.allocation.devices.results`,
driver compute.hcs.io only); what each result consumed is its `consumedCapacity` (KEP-5075;
always set for HCS's devices, which allow multiple allocations). A device's TFLOPS are read
from its node's ComputeNode at the time of counting, by the result's pool (the node) and
device name (`<vendor>-<index>`). A claim counts from its allocation until it is
deallocated or deleted, whether or not a pod runs with it yet: what it holds is held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.informer import Informer
from hcsd.cluster.kube import Kube, paths_for
from hcsd.cluster.objects import NodeView
from hcsd.contract import dra
from hcsd.profiles.exchange import share_tflops
from hcsd.quantity import QuantityError, parse_quantity

__all__ = ["ClaimHold", "ClaimUsage", "claim_hold"]

RESOURCE_VERSION = "resource.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class Share:
    """One allocated device of a claim: where, and what it consumed."""

    node: str  # the result's pool: HCS names each node's pool after the node
    device: str  # `<vendor>-<index>`
    memory: int | None  # bytes; None: the result states none, so the whole device's
    compute: int  # percent reserved


@dataclass(frozen=True, slots=True)
class ClaimHold:
    namespace: str
    shares: tuple[Share, ...]


def _amount(consumed: Mapping[str, Any], name: str) -> int:
    raw = consumed.get(name)
    if raw is None:
        return 0
    try:
        return int(parse_quantity(str(raw)))
    except QuantityError as e:
        raise ValueError(f"consumedCapacity {name}: {e}") from e


def _memory(consumed: Mapping[str, Any]) -> int | None:
    """The memory a result consumed; None when it states none: kube-scheduler leaves
    `consumedCapacity` out with the DRAConsumableCapacity gate off, and for adminAccess,
    and such a result holds the whole device (hcsd grants it so, runtime/claims.py)."""
    if consumed.get(dra.CAPACITY_MEMORY) is None:
        return None
    return _amount(consumed, dra.CAPACITY_MEMORY)


def claim_hold(obj: Mapping[str, Any]) -> ClaimHold | None:
    """What an allocated claim holds of HCS's devices; None when it holds none (not allocated,
    or only other drivers' devices). ValueError for a quantity that does not parse."""
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    shares = tuple(
        Share(
            node=str(r.get("pool", "")),
            device=str(r.get("device", "")),
            memory=_memory(r.get("consumedCapacity") or {}),
            compute=min(_amount(r.get("consumedCapacity") or {}, dra.CAPACITY_COMPUTE), 100),
        )
        for r in results
        if r.get("driver") == dra.DRIVER
    )
    if not shares:
        return None
    return ClaimHold(str((obj.get("metadata") or {}).get("namespace", "")), shares)


def amounts_of_claim(hold: ClaimHold, views: Callable[[str], NodeView | None]) -> Amounts:
    """The claim's VRAM, reserved FP16 TFLOPS (by its devices' figures in `views(node)`, 0
    for a device no ComputeNode describes) and devices. A result that states no memory
    consumed counts its device's whole memory (0 while no ComputeNode describes it)."""
    tflops, memory = 0.0, 0
    for share in hold.shares:
        view = views(share.node)
        device = next((d for d in view.devices if f"{d.vendor.value}-{d.index}" == share.device),
                      None) if view is not None else None  # fmt: skip
        if device is not None:
            tflops += share_tflops(device.tflops_fp16, share.compute)
        if share.memory is not None:
            memory += share.memory
        elif device is not None:  # stated none: the whole device's memory
            memory += device.vram_bytes
    return Amounts(memory, tflops, len(hold.shares))


class ClaimUsage:
    """The cluster's allocated claims (an informer over resourceclaims), summed by namespace."""

    def __init__(self, kube: Kube) -> None:
        self.informer: Informer[ClaimHold] = Informer(
            kube, paths_for(RESOURCE_VERSION, "resourceclaims"), claim_hold, name="resourceclaims"
        )

    def namespace_amounts(self, namespace: str, views: Callable[[str], NodeView | None]) -> Amounts:
        with self.informer.lock:
            holds = [h for h in self.informer.items.values() if h.namespace == namespace]
        total = Amounts()
        for hold in holds:
            total = total + amounts_of_claim(hold, views)
        return total
