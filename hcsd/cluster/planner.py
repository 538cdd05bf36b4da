"""Where on one node a pod's containers would go, and how good that is.

The node-level choice is hcsd's own allocator (`hcsd.allocator.choose`), so the scheduler and
the node can never disagree about what fits. Added here: the pod (containers placed one after
another on the same node), cross-model substitution through exchange rates, and a 0..10 score.

Substitution: a pod that names models (or vendors) gets only those, unless it sets
`hcs.io/allow-substitution: "true"`; then, when none of its named devices can take it, the
request is converted to FP16 TFLOPS through the profile database (N devices of the named model
= N x its dense FP16) and any model that meets it is acceptable, so 1x A100 (312) may become
4x MLU370-X8 (96 each). The per-device VRAM asked stays per device. A substituted plan scores
half, so a node with the named model always wins when one can take the pod.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hcsd.allocator import NoFit, Usage, choose
from hcsd.cluster.demand import ContainerDemand, Demand
from hcsd.contract.names import ANNOTATION_MODELS, RESOURCE_TFLOPS
from hcsd.model import Device, Grant, Request, TopologyPreference
from hcsd.profiles.database import ProfileDatabase
from hcsd.profiles.exchange import devices_as_tflops, share_tflops
from hcsd.quantity import format_bytes

__all__ = ["Plan", "Unfit", "expand_models", "plan", "shape_of"]


@dataclass(frozen=True, slots=True)
class Plan:
    grants: Mapping[str, tuple[Grant, ...]]  # container name -> grants
    models: tuple[str, ...]
    substituted: bool
    score: int  # 0..10, MaxExtenderPriority
    reserved_tflops: float  # FP16 TFLOPS the grants reserve (their compute share): for quotas

    @property
    def all_grants(self) -> tuple[Grant, ...]:
        return tuple(g for grants in self.grants.values() for g in grants)


@dataclass(frozen=True, slots=True)
class Unfit:
    reason: str  # one sentence, shown in `kubectl describe pod`


def expand_models(names: Iterable[str], db: ProfileDatabase) -> frozenset[str]:
    """User model names plus the canonical names their aliases denote, lower-cased."""
    expanded = set()
    for name in names:
        expanded.add(name.lower())
        try:
            expanded.update(p.model.lower() for p in db.find(name))
        except ValueError:
            continue
    return frozenset(expanded)


def _equivalent_tflops(
    demand: Demand, container: ContainerDemand, db: ProfileDatabase
) -> float | None:
    """FP16 TFLOPS that stand for what the container asked of its named models."""
    if container.tflops_fp16 is not None:
        return container.tflops_fp16
    named = []
    for name in sorted(demand.models):
        try:
            named += db.find(name)
        except ValueError:
            continue
    return devices_as_tflops(container.devices, named)


def _place(
    request: Request, devices: Sequence[Device], usage: dict[str, Usage]
) -> tuple[tuple[Grant, ...], str]:
    placement = choose(request, devices, usage)
    for grant in placement.grants:
        old = usage.get(grant.device_uuid, Usage())
        usage[grant.device_uuid] = Usage(
            old.vram_bytes + grant.vram_bytes, min(100, old.compute_percent + grant.compute_percent)
        )
    return placement.grants, placement.model


def plan(
    demand: Demand,
    devices: Sequence[Device],
    usage: Mapping[str, Usage],
    db: ProfileDatabase,
) -> Plan | Unfit:
    """The pod's grants on this node and their score, or why it does not fit. A pod with a
    RuntimeProfile sees only the devices the profile has an image for."""
    if not devices:
        return Unfit("node has no accelerators")
    cover = demand.cover
    if cover is not None:
        covered = [d for d in devices if cover.admits(d.vendor, d.model)]
        if not covered:
            kinds = ", ".join(sorted({f"{d.vendor.value} {d.model}" for d in devices}))
            return Unfit(
                f"runtime profile {cover.profile} has no image for this node's accelerators "
                f"({kinds}); it has images for: {cover.describe()}"
            )
        devices = covered
    working = dict(usage)
    grants: dict[str, tuple[Grant, ...]] = {}
    models: list[str] = []
    substituted = False
    strict = bool(demand.vendors or demand.models)
    for container in demand.containers:
        request = demand.request(container)
        try:
            placed, model = _place(request, devices, working)
        except NoFit as e:
            if not (strict and demand.substitution):
                return Unfit(f"container {container.name}: {_tidy(str(e), devices)}")
            tflops = _equivalent_tflops(demand, container, db)
            if tflops is None:
                return Unfit(
                    f"container {container.name}: {_tidy(str(e), devices)}; substitution needs "
                    f"{ANNOTATION_MODELS} with known FP16 TFLOPS or {RESOURCE_TFLOPS}"
                )
            loose = Request(
                container_id=container.name,
                vram_bytes=container.vram_bytes,
                devices=1,
                tflops_fp16=tflops,
                topology=demand.topology,
            )
            try:
                placed, model = _place(loose, devices, working)
            except NoFit as e2:
                return Unfit(
                    f"container {container.name}: {_tidy(str(e), devices)}; no substitute of "
                    f"{tflops:g} TFLOPS FP16 either: {_tidy(str(e2), devices)}"
                )
            substituted = True
        grants[container.name] = placed
        models.append(model)
    by_uuid = {d.uuid: d for d in devices}
    reserved = sum(
        share_tflops(by_uuid[g.device_uuid].tflops_fp16, g.compute_percent)
        for gs in grants.values()
        for g in gs
    )
    score = _score(demand, devices, usage, grants, substituted)
    return Plan(grants, tuple(models), substituted, score, reserved)


def _score(
    demand: Demand,
    devices: Sequence[Device],
    usage: Mapping[str, Usage],
    grants: Mapping[str, tuple[Grant, ...]],
    substituted: bool,
) -> int:
    """Fill fragments first (bin-packing), then health, then links for multi-device pods."""
    by_uuid = {d.uuid: d for d in devices}
    chosen = [g for gs in grants.values() for g in gs]
    leftover = []
    for grant in chosen:
        device = by_uuid[grant.device_uuid]
        used = usage.get(device.uuid, Usage()).vram_bytes
        left = device.vram_bytes - used - grant.vram_bytes
        leftover.append(max(left, 0) / device.vram_bytes if device.vram_bytes else 0.0)
    packing = 1.0 - sum(leftover) / len(leftover)
    health = sum(by_uuid[g.device_uuid].health_score for g in chosen) / (100.0 * len(chosen))
    value = 0.6 * packing + 0.4 * health
    multi = [gs for gs in grants.values() if len(gs) > 1]
    if multi:
        weakest = math.inf
        for gs in multi:
            members = [by_uuid[g.device_uuid] for g in gs]
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    link = a.link_to(b.uuid)
                    weakest = min(weakest, link.gbps if link is not None and link.p2p else 0.0)
        links = min(1.0, weakest / 300.0)  # 300 GB/s: NVLink/HCCS class
        weight = 0.6 if demand.topology is TopologyPreference.HIGH_BANDWIDTH else 0.3
        value = (1 - weight) * value + weight * links
    if substituted:
        value *= 0.5
    return max(0, min(10, round(value * 10)))


_UUID_TOKEN = re.compile(r"\bon (\S+)")


def _tidy(message: str, devices: Sequence[Device]) -> str:
    """Name devices by model and index: the same text on every node of the same shape."""
    names = {d.uuid: f"{d.model}#{d.index}" for d in devices}
    return _UUID_TOKEN.sub(lambda m: "on " + names.get(m.group(1), m.group(1)), message)


def shape_of(devices: Sequence[Device], usage: Mapping[str, Usage]) -> tuple[object, ...]:
    """What decides a plan on a node, without its identity: equal shapes, equal answers."""
    index = {d.uuid: i for i, d in enumerate(devices)}
    return tuple(
        (
            d.vendor,
            d.model,
            d.index,
            d.vram_bytes,
            d.tflops_fp16,
            d.health_state,
            d.health_score,
            usage.get(d.uuid, Usage()),
            tuple((index.get(link.peer_uuid, -1), link.kind, link.gbps) for link in d.links),
        )
        for d in devices
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """Per chip model on one node, in the allocator's (vendor, model) order: schedulable
    devices as (free VRAM, -health, index, position on the node, VRAM), sorted, so the common
    request (one container, one slice of VRAM) is a binary search instead of a run of the
    allocator. Built once per change of the node."""

    groups: tuple[tuple[str, str, tuple[tuple[int, int, int, int, int], ...]], ...]


def summarise(devices: Sequence[Device], usage: Mapping[str, Usage]) -> Summary:
    groups: dict[tuple[str, str], list[tuple[int, int, int, int, int]]] = {}
    for position, d in enumerate(devices):
        if not d.health_state.schedulable:
            continue
        free = d.vram_bytes - usage.get(d.uuid, Usage()).vram_bytes
        groups.setdefault((d.vendor.value, d.model), []).append(
            (free, -d.health_score, d.index, position, d.vram_bytes)
        )
    return Summary(tuple((*key, tuple(sorted(items))) for key, items in sorted(groups.items())))


def quick_fit(demand: Demand, summary: Summary) -> tuple[int, str] | None:
    """(score, "") or (-1, reason) for one container asking one device's slice of VRAM; None
    when the demand is of another kind (the allocator decides those). The same choice as
    `choose`: the fit leaving the least VRAM behind, then the healthier device, then the lower
    index, then the earlier device on the node; across models, the earlier (vendor, model)."""
    if len(demand.containers) != 1 or demand.substitution:
        return None
    container = demand.containers[0]
    want = container.vram_bytes
    if want is None or container.devices != 1 or container.tflops_fp16 is not None:
        return None
    best: tuple[int, int, int, int, int] | None = None
    allowed = []
    vendors = {v.value for v in demand.vendors}
    cover = demand.cover
    for vendor, model, items in summary.groups:
        if (
            (vendors and vendor not in vendors)
            or (demand.models and model.lower() not in demand.models)
            or (cover is not None and not cover.admits(vendor, model))
        ):
            continue
        allowed.append((model, items))
        position = bisect.bisect_left(items, (want,))
        if position < len(items):
            found = items[position]
            # Across models only a strictly better fit wins: ties go to the earlier group.
            if best is None or found[:3] < best[:3]:
                best = found
    if best is None:
        if len(allowed) != 1:
            return None  # none, or several models to explain: the allocator words it
        model, items = allowed[0]
        top = items[-1][0]
        largest = min((item for item in items if item[0] == top), key=lambda item: item[3])
        return -1, (
            f"container {container.name}: {model}: {format_bytes(want)} wanted, most free "
            f"is {format_bytes(max(top, 0))} on {model}#{largest[2]}"
        )
    free, negative_health, _, _, vram = best
    packing = 1.0 - max(free - want, 0) / vram if vram else 0.0
    value = 0.6 * packing + 0.4 * (-negative_health / 100.0)  # `_score`'s arithmetic exactly
    return max(0, min(10, round(value * 10))), ""
