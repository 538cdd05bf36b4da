"""One node's ResourceSlice (resource.k8s.io/v1) built from hcsd's devices: pure, no I/O.

The DRA mode's inventory, as the ComputeNode's spec is the extender mode's. One slice per node,
its pool named after the node; one device per accelerator, named `<vendor>-<index>` as its CDI
device is. What kube-scheduler matches on:
- attributes (hcsd.contract.dra): vendor, model, uuid, index, pciBusID, numaNode, linkDomain
  (the NVLink/HCCS/XGMI/MLU-Link island the device is in), tflopsFP16;
- consumable capacities (KEP-5075, beta and on by default at Kubernetes 1.36): `memory` in
  bytes, consumed in steps of MEMORY_STEP_BYTES, and `compute` in percent; the device allows
  multiple allocations, so claims share it up to those totals. A request naming no capacity
  takes the policies' defaults: all of the memory (in whole steps), so the device is its
  alone, and no reserved compute (best effort, as the extender mode's VRAM-only slices); a
  share names its memory, and its compute when it wants some reserved;
- device taints (beta and on by default at 1.36): a device hcsd holds unschedulable
  (unhealthy, lost) carries TAINT_UNHEALTHY, NoSchedule unless the operator asked NoExecute.

Deterministic, like the ComputeNode's shapes: devices sorted, quantities as plain integers,
a taint's `timeAdded` carried over from the slice as stored (the API server sets it on the
write that adds the taint), so an unchanged node builds an equal slice and is not rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.objects import measured_of, published
from hcsd.contract import dra
from hcsd.model import LinkKind
from hcsd.quantity import QuantityError, parse_quantity

__all__ = [
    "API_VERSION",
    "TAINT_EFFECTS",
    "device_name",
    "link_domains",
    "resource_slice",
    "same_devices",
    "slice_name",
    "slice_spec",
]

API_VERSION = "resource.k8s.io/v1"
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
ATTRIBUTE_MAX = 64  # a string attribute's maxLength: longer fails the whole slice's write
NAME_MAX = 253
# Links that make devices one island (their collective traffic stays off PCIe).
_FABRIC = frozenset({LinkKind.NVLINK, LinkKind.HCCS, LinkKind.XGMI, LinkKind.MLULINK})
_RANK = {kind.value: rank for rank, kind in enumerate(LinkKind)}  # best first
_UNSCHEDULABLE = frozenset({pb.HEALTH_STATE_UNHEALTHY, pb.HEALTH_STATE_LOST})
_STATE = {pb.HEALTH_STATE_UNHEALTHY: "unhealthy", pb.HEALTH_STATE_LOST: "lost"}


def slice_name(node: str) -> str:
    """`compute.hcs.io-<node>`: one per node, a fixed name so the syncer finds its own."""
    return f"{dra.DRIVER}-{node}"[:NAME_MAX].rstrip("-.")


def device_name(device: pb.Device) -> str:
    """`nvidia-0`: the name its CDI device has (hcsd.runtime.cdi), a DNS label."""
    return f"{device.vendor}-{device.index}"


def link_domains(devices: Sequence[pb.Device]) -> dict[str, str]:
    """uuid -> its island: the devices joined by vendor fabric links (NVLink, HCCS, XGMI,
    MLU-Link), named `<vendor>-<link kind>-<lowest index>` so that the name is the same on
    every pass. Devices with no fabric link are in none (no entry)."""
    by_uuid = {d.uuid: d for d in devices}
    parent = {u: u for u in by_uuid}

    def root(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    kinds: dict[str, set[str]] = {}  # uuid -> the fabric link kinds at either end
    for d in devices:
        for link in d.links:
            if link.kind in _FABRIC and link.peer_uuid in by_uuid:
                parent[root(d.uuid)] = root(link.peer_uuid)
                kinds.setdefault(d.uuid, set()).add(link.kind)
                kinds.setdefault(link.peer_uuid, set()).add(link.kind)
    islands: dict[str, list[pb.Device]] = {}
    for d in devices:
        if d.uuid in kinds:
            islands.setdefault(root(d.uuid), []).append(d)
    found: dict[str, str] = {}
    for members in islands.values():
        first = min(members, key=lambda d: (d.index, d.uuid))
        # the best kind in the island (LinkKind lists best first)
        kind = min((k for d in members for k in kinds[d.uuid]), key=_RANK.__getitem__)
        for d in members:
            found[d.uuid] = f"{first.vendor}-{kind}-{first.index}"
    return found


def _tflops(device: pb.Device) -> str:
    """The FP16 TFLOPS the extender scores with: the node's measurement, else the profile's."""
    measured = measured_of(device) or {}
    value = float(measured.get("tflopsFP16", published(device).tflops_fp16))  # refused: profile
    return format(round(value, 3), "g")


def _attributes(device: pb.Device, domain: str | None) -> dict[str, dict[str, Any]]:
    def text(value: str) -> dict[str, str]:
        return {"string": value[:ATTRIBUTE_MAX]}

    found: dict[str, dict[str, Any]] = {
        dra.ATTR_VENDOR: text(device.vendor),
        dra.ATTR_MODEL: text(device.model),
        dra.ATTR_UUID: text(device.uuid),
        dra.ATTR_INDEX: {"int": device.index},
        dra.ATTR_TFLOPS: text(_tflops(device)),
    }
    if device.pci_bus_id:
        found[dra.ATTR_PCI_BUS] = text(device.pci_bus_id.lower())
    if device.numa_node >= 0:
        found[dra.ATTR_NUMA] = {"int": device.numa_node}
    if domain:
        found[dra.ATTR_LINK_DOMAIN] = text(domain)
    return found


def _capacity(device: pb.Device) -> dict[str, dict[str, Any]]:
    """memory and compute with their request policies. Memory is consumed in steps of
    MEMORY_STEP_BYTES from one step up, by default all of it (in whole steps); a device of
    under two steps is too small to share and has no policy, so a claim takes all of it.
    Compute in whole percents, by default none reserved."""
    step = dra.MEMORY_STEP_BYTES
    memory: dict[str, Any] = {"value": str(device.vram_bytes)}
    if device.vram_bytes >= 2 * step:
        memory["requestPolicy"] = {
            "default": str(device.vram_bytes // step * step),
            "validRange": {"min": str(step), "step": str(step)},
        }
    compute = {
        "value": "100",
        "requestPolicy": {
            # 0: a claim that names no compute reserves none (best effort), as a VRAM-only
            # slice does in the extender mode; a whole-device claim is still alone on the
            # device, since it takes all of the memory.
            "default": "0",
            "validRange": {"min": "0", "max": "100", "step": str(dra.COMPUTE_STEP_PERCENT)},
        },
    }
    return {dra.CAPACITY_MEMORY: memory, dra.CAPACITY_COMPUTE: compute}


def _taints(
    device: pb.Device, effect: str, stored: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    if device.health_state not in _UNSCHEDULABLE:
        return []
    taint: dict[str, Any] = {
        "key": dra.TAINT_UNHEALTHY,
        "value": _STATE[device.health_state],
        "effect": effect,
    }
    for old in stored:  # the time the API server stamped on it, while it is the same taint
        if all(old.get(k) == v for k, v in taint.items()) and old.get("timeAdded"):
            taint["timeAdded"] = old["timeAdded"]
    return [taint]


def slice_spec(
    node: str,
    devices: Sequence[pb.Device],
    *,
    generation: int,
    taint_effect: str = "NoSchedule",
    stored: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The slice's spec for `node` at pool `generation`; `stored`: the spec as the API server
    holds it now (for the taints' timeAdded)."""
    if taint_effect not in TAINT_EFFECTS:
        raise ValueError(f"device taint effect {taint_effect!r} is not one of {TAINT_EFFECTS}")
    before = {str(d.get("name")): d for d in (stored or {}).get("devices") or ()}
    domains = link_domains(devices)
    entries = []
    for d in sorted(devices, key=lambda d: (d.vendor, d.index, d.uuid)):
        name = device_name(d)
        entry: dict[str, Any] = {
            "name": name,
            "attributes": _attributes(d, domains.get(d.uuid)),
            "capacity": _capacity(d),
            "allowMultipleAllocations": True,
        }
        taints = _taints(d, taint_effect, (before.get(name) or {}).get("taints") or ())
        if taints:
            entry["taints"] = taints
        entries.append(entry)
    return {
        "driver": dra.DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "devices": entries,
    }


def resource_slice(node: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A new ResourceSlice object holding `spec`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": dict(spec),
    }


def _canonical(value: Any, key: str = "") -> Any:
    """`value` with quantities as numbers: the API server may write `1Gi` where we sent
    `1073741824`, which is the same slice."""
    if isinstance(value, dict):
        return {k: _canonical(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str) and key in ("value", "default", "min", "max", "step"):
        try:
            return parse_quantity(value)
        except QuantityError:
            return value
    return value


def same_devices(stored: Mapping[str, Any] | None, body: Mapping[str, Any]) -> bool:
    """Whether the stored spec offers what `body` would (the pool's generation aside)."""
    if not stored:
        return False
    keys = ("driver", "nodeName", "devices")
    a = {k: _canonical(stored.get(k) or ([] if k == "devices" else "")) for k in keys}
    b = {k: _canonical(body.get(k) or ([] if k == "devices" else "")) for k in keys}
    return a == b and (stored.get("pool") or {}).get("name") == (body.get("pool") or {}).get("name")
