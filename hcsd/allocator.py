"""Choosing the device(s) on this node for a request.

Pure functions over the inventory and current usage: no I/O, no clock, so every choice is
reproducible in a test table. The order of preference, and why:
1. only devices that pass the allow-lists and are schedulable (healthy or degraded);
2. among chip models that can serve the request, the one needing the fewest devices
   (fewer devices = less communication and less fragmentation);
3. for multi-device requests, the best-linked set (primary under `high-bandwidth`, a
   tie-breaker otherwise);
4. bin-packing: the fit that leaves the least free VRAM behind, so whole devices stay whole
   (or the opposite under `spread`);
5. healthier devices first, then lower index, so results are stable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hcsd.model import Device, Grant, Request, SpreadPolicy, TopologyPreference
from hcsd.profiles.exchange import devices_for, share_percent
from hcsd.quantity import format_bytes
from hcsd.refusals import Reason, Refusal
from hcsd.sections import Section, checks, setting

__all__ = ["AllocatorSection", "NoFit", "Placement", "Usage", "choose"]

_MAX_COMBINATIONS = 5_000


@dataclass(frozen=True, slots=True)
class AllocatorSection(Section):
    """`[allocator]`: the policy for requests that name none of their own."""

    policy: SpreadPolicy = setting(
        SpreadPolicy.BINPACK,
        "binpack fills partly used devices first; spread picks the least used.",
        checks.enum(SpreadPolicy),
        reload=True,
    )


class NoFit(Refusal):
    """No device set on this node can serve the request (a permanent refusal)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What is already held on one device."""

    vram_bytes: int = 0
    compute_percent: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    grants: tuple[Grant, ...]
    model: str


@dataclass(frozen=True, slots=True)
class _Need:
    count: int
    vram_bytes: int
    compute_percent: int


def choose(
    request: Request,
    devices: Sequence[Device],
    usage: Mapping[str, Usage],
    *,
    default_policy: SpreadPolicy = SpreadPolicy.BINPACK,
) -> Placement:
    """Pick grants for `request`, or raise NoFit with a reason a person can act on."""
    policy = request.policy or default_policy
    allowed = [d for d in devices if _allowed(request, d)]
    if not allowed:
        raise NoFit(Reason.NO_MATCHING_DEVICE, _describe_filter(request, devices))
    healthy = [d for d in allowed if d.health_state.schedulable]
    if not healthy:
        states = sorted({d.health_state.value for d in allowed})
        raise NoFit(
            Reason.UNHEALTHY,
            f"all {len(allowed)} matching device(s) are {'/'.join(states)}",
        )
    groups: dict[tuple[str, str], list[Device]] = {}
    for device in healthy:
        groups.setdefault((device.vendor.value, device.model), []).append(device)

    best: tuple[tuple[float, ...], Placement] | None = None
    failures: list[NoFit] = []
    for (_, model), members in sorted(groups.items()):
        try:
            need = _need(request, members[0])
            chosen, score = _pick(request, need, members, usage, policy)
        except NoFit as e:
            failures.append(e)
            continue
        key = (need.count, *score)
        grants = tuple(
            Grant(
                device_uuid=d.uuid, vram_bytes=need.vram_bytes, compute_percent=need.compute_percent
            )
            for d in chosen
        )
        if best is None or key < best[0]:
            best = (key, Placement(grants=grants, model=model))
    if best is None:
        # Report the most specific failure: the first group's is as good as any, but prefer
        # VRAM over compute over topology because that is what users most often misjudge.
        order = [
            Reason.INSUFFICIENT_VRAM,
            Reason.INSUFFICIENT_COMPUTE,
            Reason.INSUFFICIENT_DEVICES,
            Reason.NO_LINKED_SET,
            Reason.UNKNOWN_TFLOPS,
        ]
        failures.sort(key=lambda f: order.index(f.reason) if f.reason in order else len(order))
        first = failures[0]
        message = "; ".join(dict.fromkeys(str(f) for f in failures))
        raise NoFit(first.reason, message)
    return best[1]


def _allowed(request: Request, device: Device) -> bool:
    if request.vendors and device.vendor not in request.vendors:
        return False
    return not request.models or device.model.lower() in {m.lower() for m in request.models}


def _describe_filter(request: Request, devices: Sequence[Device]) -> str:
    if not devices:
        return "this node has no accelerators"
    parts = []
    if request.vendors:
        parts.append("vendors " + ",".join(sorted(v.value for v in request.vendors)))
    if request.models:
        parts.append("models " + ",".join(sorted(request.models)))
    have = sorted({f"{d.vendor.value}/{d.model}" for d in devices})
    return f"no device matches {' and '.join(parts)} (node has {', '.join(have)})"


def _need(request: Request, sample: Device) -> _Need:
    """Turn the request into a per-device need for one chip model."""
    count = request.devices
    compute = request.compute_percent
    if request.tflops_fp16 is not None:
        if sample.tflops_fp16 <= 0:
            raise NoFit(Reason.UNKNOWN_TFLOPS, f"{sample.model}: FP16 TFLOPS unknown")
        count = max(devices_for(request.tflops_fp16, sample.tflops_fp16), request.devices)
        if count == 1 and not compute:
            compute = share_percent(request.tflops_fp16, sample.tflops_fp16)
    if request.vram_bytes is None:
        return _Need(count=count, vram_bytes=sample.vram_bytes, compute_percent=100)
    return _Need(count=count, vram_bytes=request.vram_bytes, compute_percent=compute)


def _pick(
    request: Request,
    need: _Need,
    members: Sequence[Device],
    usage: Mapping[str, Usage],
    policy: SpreadPolicy,
) -> tuple[tuple[Device, ...], tuple[float, ...]]:
    def free(device: Device) -> int:
        return device.vram_bytes - usage.get(device.uuid, Usage()).vram_bytes

    def compute_free(device: Device) -> int:
        return 100 - usage.get(device.uuid, Usage()).compute_percent

    fitting = [d for d in members if free(d) >= need.vram_bytes]
    model = members[0].model
    if len(fitting) < need.count:
        largest = max(members, key=free)
        if need.count == 1:
            raise NoFit(
                Reason.INSUFFICIENT_VRAM,
                f"{model}: {format_bytes(need.vram_bytes)} wanted, most free is "
                f"{format_bytes(max(free(largest), 0))} on {largest.uuid}",
            )
        raise NoFit(
            Reason.INSUFFICIENT_VRAM if len(members) >= need.count else Reason.INSUFFICIENT_DEVICES,
            f"{model}: {need.count} device(s) with {format_bytes(need.vram_bytes)} free wanted, "
            f"{len(fitting)} of {len(members)} have it",
        )
    fitting = [d for d in fitting if compute_free(d) >= need.compute_percent]
    if len(fitting) < need.count:
        raise NoFit(
            Reason.INSUFFICIENT_COMPUTE,
            f"{model}: {need.count} device(s) with {need.compute_percent}% compute free wanted, "
            f"{len(fitting)} have it",
        )

    def packing(device: Device) -> float:
        left = free(device) - need.vram_bytes
        return float(left if policy is SpreadPolicy.BINPACK else -left)

    def tie(device: Device) -> tuple[float, float]:
        return (-device.health_score, device.index)

    if need.count == 1:
        chosen = min(fitting, key=lambda d: (packing(d), *tie(d)))
        return (chosen,), (packing(chosen), *tie(chosen))

    high_bandwidth = request.topology is TopologyPreference.HIGH_BANDWIDTH
    best: tuple[tuple[float, ...], tuple[Device, ...]] | None = None
    for subset in _subsets(fitting, need.count, key=lambda d: (packing(d), *tie(d))):
        links = _link_quality(subset)
        pack = sum(packing(d) for d in subset)
        health = sum(tie(d)[0] for d in subset)
        order = sum(d.index for d in subset)
        key = (*links, pack, health, order) if high_bandwidth else (pack, *links, health, order)
        if best is None or key < best[0]:
            best = (key, subset)
    assert best is not None  # fitting has at least `count` devices
    if high_bandwidth and best[0][0] == 0:
        raise NoFit(
            Reason.NO_LINKED_SET,
            f"{model}: no set of {need.count} devices with peer-to-peer links has room",
        )
    return best[1], best[0]


def _subsets(
    devices: Sequence[Device], count: int, key: Callable[[Device], tuple[float, ...]]
) -> Iterable[tuple[Device, ...]]:
    """Every combination while that is cheap; past that, the best-packed devices only."""
    if math.comb(len(devices), count) <= _MAX_COMBINATIONS:
        return itertools.combinations(devices, count)
    ranked = sorted(devices, key=key)
    width = count
    while width < len(ranked) and math.comb(width + 1, count) <= _MAX_COMBINATIONS:
        width += 1
    return itertools.combinations(ranked[:width], count)


def _link_quality(devices: Sequence[Device]) -> tuple[float, float]:
    """(-weakest pair bandwidth, -total): lower is better, so it sorts with the other keys."""
    weakest = math.inf
    total = 0.0
    for a, b in itertools.combinations(devices, 2):
        link = a.link_to(b.uuid)
        gbps = link.gbps if link is not None and link.p2p else 0.0
        weakest = min(weakest, gbps)
        total += gbps
    return (-weakest, -total)
