"""What a pod's `ai.compute/*` request becomes in DRA mode: a ResourceClaimTemplate's spec.

Pure: a `Demand` (demand.py, the extender's own reading of the pod) and the profile database in,
a dict out, so one request means the same thing in both modes:

- `ai.compute/vram` is per device and becomes `capacity.requests.memory` (rounded up to the
  ResourceSlices' step, which the scheduler would round to anyway); no VRAM asked means whole
  devices: `compute: 100` and no memory request, so the slice's request policy default (the
  whole device's memory) applies.
- `compute` is always asked explicitly: the share of one device a TFLOPS request needs
  (`share_percent`, exactly as the allocator reserves it), 0 for a VRAM-only request (the
  extender reserves no compute for those either), 100 for whole devices. A TFLOPS request met
  by several devices reserves no share on each of them, as in `allocator._need`.
- TFLOPS, and substitution with consent, become a `firstAvailable` list: one alternative per
  group of chip models from the exchange rates (`devices_for`, `share_percent`), named models
  first, substitutes after, each tier ordered fewest devices first, then the tightest fit (the
  largest share: a small job keeps off the big chips, as bin-packing does in the extender).
  Kubernetes allows 8 alternatives: models asking the same devices and share share one
  alternative; past 8, the two alternatives whose union over-reserves the fewest percent
  points are merged (the merged one asks the larger share) until 8 are left.
- `hcs.io/topology-preference: high-bandwidth` puts every multi-device alternative on one link
  domain (`matchAttribute` on linkDomain: a device without one, on a node without a fabric,
  cannot be chosen). Every multi-device alternative also gets `distinctAttribute` on the uuid:
  a shareable device must not count twice in one request.

`ShapeError` says in one sentence why a request cannot be translated; the webhook refuses the
pod with it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hcsd.cluster.demand import ContainerDemand, Cover, Demand
from hcsd.cluster.planner import expand_models
from hcsd.contract.dra import (
    ATTR_LINK_DOMAIN,
    ATTR_MODEL,
    ATTR_UUID,
    ATTR_VENDOR,
    CAPACITY_COMPUTE,
    CAPACITY_MEMORY,
    CLASS_ANY,
    DRIVER,
    MEMORY_STEP_BYTES,
    vendor_class,
)
from hcsd.contract.names import ANNOTATION_MODELS, ANNOTATION_VENDORS, RESOURCE_VRAM
from hcsd.model import TopologyPreference
from hcsd.profiles.database import Profile, ProfileDatabase
from hcsd.profiles.exchange import devices_as_tflops, devices_for, share_percent
from hcsd.quantity import format_bytes, parse_bytes

__all__ = [
    "MAX_ALTERNATIVES",
    "Alternative",
    "Selected",
    "ShapeError",
    "alternatives_for",
    "chosen_alternatives",
    "claim_spec",
    "memory_quantity",
    "selected",
    "template_name",
]

#: Kubernetes' limit on `firstAvailable` (resource/v1 FirstAvailableDeviceRequestMaxSize).
MAX_ALTERNATIVES = 8
TEMPLATE_PREFIX = "hcs-"


class ShapeError(ValueError):
    """The request cannot become a claim (permanent: the pod is refused with this sentence)."""


@dataclass(frozen=True, slots=True)
class Member:
    """One chip model an alternative selects, with the share it needs of it."""

    vendor: str
    model: str  # the profile's name; lower-cased in the selector
    compute: int


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to serve a container: `count` devices, each with `memory` bytes (None: whole
    devices) and `compute` percent, of the models in `members` (empty: any model of
    `vendors`, or of any vendor)."""

    count: int
    memory: int | None
    compute: int
    members: tuple[Member, ...] = ()
    vendors: tuple[str, ...] = ()
    models: tuple[str, ...] = ()  # lower-case model names a user wrote (with `members` empty)
    substitute: bool = False

    @property
    def selected_vendors(self) -> tuple[str, ...]:
        if self.members:
            return tuple(sorted({m.vendor for m in self.members}))
        return self.vendors

    @property
    def selected_models(self) -> tuple[str, ...]:
        if self.members:
            return tuple(sorted({m.model.lower() for m in self.members}))
        return self.models


def _round_memory(vram: int | None) -> int | None:
    if vram is None:
        return None
    return -(-vram // MEMORY_STEP_BYTES) * MEMORY_STEP_BYTES


def memory_quantity(value: int) -> str:
    """A byte count in the form the API server writes back (a multiple of 256Mi: Ti, Gi or Mi),
    so a template read back compares equal to the one generated."""
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def _per_model(
    profile: Profile, tflops: float, devices: int, vram: int | None, *, substitute: bool
) -> Alternative | None:
    """The allocator's `_need` for one model (None: the model cannot serve it)."""
    per_device = profile.figure("tflops_fp16")
    if per_device <= 0 or (vram is not None and profile.vram_bytes < vram):
        return None
    count = max(devices_for(tflops, per_device), devices)
    share = share_percent(tflops, per_device) if count == 1 else 0
    compute = 100 if vram is None else share
    member = Member(profile.vendor.value, profile.model, compute)
    return Alternative(count, _round_memory(vram), compute, (member,), substitute=substitute)


def _allowed(profile: Profile, demand: Demand, models: frozenset[str]) -> bool:
    if demand.vendors and profile.vendor not in demand.vendors:
        return False
    if demand.cover is not None and not demand.cover.admits(profile.vendor, profile.model):
        return False
    return not demand.models or profile.model.lower() in models


def _check_vram(container: ContainerDemand, candidates: Sequence[Profile]) -> None:
    if container.vram_bytes is None or not candidates:
        return
    largest = max(candidates, key=lambda p: p.vram_bytes)
    if largest.vram_bytes < container.vram_bytes:
        raise ShapeError(
            f"container {container.name}: {RESOURCE_VRAM} {format_bytes(container.vram_bytes)} "
            f"per device is more than any allowed device has (largest: {largest.key} with "
            f"{format_bytes(largest.vram_bytes)})"
        )


def alternatives_for(
    demand: Demand, container: ContainerDemand, db: ProfileDatabase
) -> list[Alternative]:
    """Every way to serve `container`, named models first, before grouping (see module doc)."""
    models = expand_models(demand.models, db)
    allowed = [p for p in db.profiles if _allowed(p, demand, models)]
    unknown = {m for m in demand.models if not db_knows(db, m)}
    if demand.models and not allowed and not unknown:
        raise ShapeError(
            f"{ANNOTATION_MODELS} and {ANNOTATION_VENDORS} allow no model together "
            f"(models {', '.join(sorted(demand.models))}; vendors "
            f"{', '.join(sorted(v.value for v in demand.vendors))})"
        )
    consent = demand.substitution and bool(demand.vendors or demand.models)
    if not unknown:
        _check_vram(container, db.profiles if consent else allowed)
    strict: list[Alternative] = []
    if container.tflops_fp16 is None:
        strict.append(
            Alternative(
                count=container.devices,
                memory=_round_memory(container.vram_bytes),
                compute=0 if container.vram_bytes is not None else 100,
                vendors=tuple(sorted(v.value for v in demand.vendors)),
                models=tuple(sorted(models)),
            )
        )
    else:
        for profile in allowed:
            found = _per_model(
                profile, container.tflops_fp16, container.devices, container.vram_bytes,
                substitute=False,
            )  # fmt: skip
            if found is not None:
                strict.append(found)
        if not strict and not consent:
            raise ShapeError(
                f"container {container.name}: no allowed model with a known FP16 TFLOPS "
                f"figure{' and enough VRAM' if container.vram_bytes else ''} can serve "
                f"{container.tflops_fp16:g} TFLOPS"
            )
    if demand.cover is not None:
        strict = _covered(strict, demand.cover, container.name, consent)
    if not consent:
        return strict
    # What the extender converts to (planner._equivalent_tflops): the TFLOPS asked, else the
    # named models' worth; without either it cannot substitute, and neither does this.
    tflops = container.tflops_fp16
    if tflops is None:
        named = [p for p in db.profiles if p.model.lower() in models]
        tflops = devices_as_tflops(container.devices, named)
    if tflops is None:
        return strict
    taken = {p.model for p in allowed}
    substitutes = [
        found
        for p in db.profiles
        if p.model not in taken
        and (demand.cover is None or demand.cover.admits(p.vendor, p.model))
        and (found := _per_model(p, tflops, 1, container.vram_bytes, substitute=True))
    ]
    if not strict and not substitutes:
        raise ShapeError(
            f"container {container.name}: no model with a known FP16 TFLOPS figure"
            f"{' and enough VRAM' if container.vram_bytes else ''} can serve {tflops:g} TFLOPS"
        )
    return strict + substitutes


def _covered(
    alternatives: Sequence[Alternative], cover: Cover, container: str, consent: bool
) -> list[Alternative]:
    """The alternatives narrowed to the devices a RuntimeProfile has an image for: an
    alternative naming vendors and models (not profile members) becomes one per profile entry
    it meets, in the profile's order; one naming members was filtered by `_allowed` already.
    ShapeError when none is left and no substitute may be looked for."""
    found: list[Alternative] = []
    for alternative in alternatives:
        if alternative.members:
            found.append(alternative)
            continue
        for vendor, models in cover.entries:
            if alternative.vendors and vendor.value not in alternative.vendors:
                continue
            if alternative.models and models:
                narrowed = tuple(sorted(set(alternative.models) & models))
                if not narrowed:
                    continue
            else:
                narrowed = alternative.models or tuple(sorted(models))
            entry = replace(alternative, vendors=(vendor.value,), models=narrowed)
            if entry not in found:
                found.append(entry)
    if not found and not consent:
        raise ShapeError(
            f"container {container}: runtime profile {cover.profile} has no image for the "
            f"devices asked for (it has images for: {cover.describe()})"
        )
    return found


def db_knows(db: ProfileDatabase, name: str) -> bool:
    try:
        return bool(db.find(name))
    except ValueError:
        return False


def _merge(a: Alternative, b: Alternative) -> Alternative:
    return replace(a, compute=max(a.compute, b.compute), members=a.members + b.members)


def _cost(a: Alternative, b: Alternative) -> int:
    """Percent points the merged alternative reserves beyond what each model needs."""
    top = max(a.compute, b.compute)
    return sum(top - m.compute for m in a.members + b.members)


def _mergeable(a: Alternative, b: Alternative) -> bool:
    return (
        bool(a.members and b.members)
        and a.substitute == b.substitute
        and (a.count, a.memory) == (b.count, b.memory)
    )


def _order(alternatives: Iterable[Alternative]) -> list[Alternative]:
    return sorted(
        alternatives,
        key=lambda a: (a.substitute, a.count, -a.compute, a.selected_vendors, a.selected_models),
    )


def group(alternatives: Sequence[Alternative]) -> list[Alternative]:
    """At most MAX_ALTERNATIVES, best first: free merges always, then the cheapest ones."""
    same: dict[tuple[object, ...], Alternative] = {}  # the free merges, in one pass
    working = []
    for alternative in alternatives:
        if not alternative.members:
            working.append(alternative)
            continue
        key = (alternative.substitute, alternative.count, alternative.memory, alternative.compute)
        found = same.get(key)
        same[key] = alternative if found is None else _merge(found, alternative)
    working += same.values()
    while len(working) > 1:
        pairs = [
            (_cost(a, b), i, j)
            for i, a in enumerate(working)
            for j, b in enumerate(working)
            if i < j and _mergeable(a, b)
        ]
        if not pairs:
            break
        cost, i, j = min(pairs)
        if cost > 0 and len(working) <= MAX_ALTERNATIVES:
            break
        merged = _merge(working[i], working[j])
        working = [a for k, a in enumerate(working) if k not in (i, j)] + [merged]
    # Past 8 with nothing left to merge (different device counts): the last ones go.
    return _order(working)[:MAX_ALTERNATIVES]


def _selector(alternative: Alternative) -> list[dict[str, Any]]:
    tests = []
    vendors = alternative.selected_vendors
    if len(vendors) > 1:
        tests.append(f"has(a.{ATTR_VENDOR}) && a.{ATTR_VENDOR} in {json.dumps(list(vendors))}")
    models = alternative.selected_models
    if models:
        tests.append(
            f"has(a.{ATTR_MODEL}) && a.{ATTR_MODEL}.lowerAscii() in {json.dumps(list(models))}"
        )
    if not tests:
        return []
    expression = f'cel.bind(a, device.attributes["{DRIVER}"], {" && ".join(tests)})'
    return [{"cel": {"expression": expression}}]


_VENDORS_IN = re.compile(rf"a\.{ATTR_VENDOR} in (\[[^\]]*\])")
_MODELS_IN = re.compile(rf"a\.{ATTR_MODEL}\.lowerAscii\(\) in (\[[^\]]*\])")


@dataclass(frozen=True, slots=True)
class Selected:
    """What one device request of a template made here asks for, read back from it (the
    inverse of `_device_request`): the profile gate controller chooses among these."""

    count: int
    memory: int | None  # bytes per device; None: whole devices
    compute: int
    vendors: tuple[str, ...]  # empty: any vendor
    models: tuple[str, ...]  # lower case; empty: any model


def selected(request: Mapping[str, Any]) -> Selected:
    """Read a device request (`exactly` or one `firstAvailable` entry) this module wrote;
    ValueError for one it did not write."""
    vendors: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    klass = str(request.get("deviceClassName") or "")
    if klass != CLASS_ANY:
        vendor = klass.removesuffix(f".{DRIVER}")
        if vendor == klass or "." in vendor:
            raise ValueError(f"device class {klass[:80]!r} is not a vendor's class")
        vendors = (vendor,)
    for selector in request.get("selectors") or ():
        expression = str((selector.get("cel") or {}).get("expression") or "")
        if (found := _VENDORS_IN.search(expression)) is not None:
            vendors = tuple(json.loads(found.group(1)))
        if (found := _MODELS_IN.search(expression)) is not None:
            models = tuple(json.loads(found.group(1)))
    requests = (request.get("capacity") or {}).get("requests") or {}
    memory = requests.get(CAPACITY_MEMORY)
    return Selected(
        count=int(request.get("count") or 1),
        memory=None if memory is None else parse_bytes(str(memory)),
        compute=int(str(requests.get(CAPACITY_COMPUTE, "0"))),
        vendors=vendors,
        models=models,
    )


def _device_request(alternative: Alternative) -> dict[str, Any]:
    vendors = alternative.selected_vendors
    requests = {CAPACITY_COMPUTE: str(alternative.compute)}
    if alternative.memory is not None:
        requests[CAPACITY_MEMORY] = memory_quantity(alternative.memory)
    body: dict[str, Any] = {
        "deviceClassName": vendor_class(vendors[0]) if len(vendors) == 1 else CLASS_ANY,
        "allocationMode": "ExactCount",
        "count": alternative.count,
    }
    selectors = _selector(alternative)
    if selectors:
        body["selectors"] = selectors
    body["capacity"] = {"requests": requests}
    return body


def _constraints(where: str, alternative: Alternative, demand: Demand) -> list[dict[str, Any]]:
    if alternative.count < 2:
        return []
    found = [{"requests": [where], "distinctAttribute": f"{DRIVER}/{ATTR_UUID}"}]
    if demand.topology is TopologyPreference.HIGH_BANDWIDTH:
        found.append({"requests": [where], "matchAttribute": f"{DRIVER}/{ATTR_LINK_DOMAIN}"})
    return found


def request_name(index: int) -> str:
    """The claim request of the pod's `index`-th container asking for accelerators."""
    return f"r{index}"


@functools.lru_cache(maxsize=1024)
def _chosen(demand: Demand, container: ContainerDemand, db: ProfileDatabase) -> list[Alternative]:
    """`group(alternatives_for(...))` once per shape: a replica sees the same few shapes again
    and again, and an unhinted TFLOPS request takes milliseconds to group."""
    return group(alternatives_for(demand, container, db))


def chosen_alternatives(
    demand: Demand, container: ContainerDemand, db: ProfileDatabase
) -> list[Alternative]:
    """The alternatives `claim_spec` asks for `container`, best first (cached per shape)."""
    return _chosen(replace(demand, namespace="", containers=()), container, db)


def claim_spec(demand: Demand, db: ProfileDatabase) -> dict[str, Any]:
    """The ResourceClaimSpec for `demand`: one request per container (`request_name`)."""
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    shape = replace(demand, namespace="", containers=())  # what the translation reads of it
    for index, container in enumerate(demand.containers):
        name = request_name(index)
        chosen = _chosen(shape, container, db)
        if len(chosen) == 1:
            requests.append({"name": name, "exactly": _device_request(chosen[0])})
            constraints += _constraints(name, chosen[0], demand)
            continue
        subrequests = []
        for number, alternative in enumerate(chosen):
            sub = f"alt{number}"
            subrequests.append({"name": sub, **_device_request(alternative)})
            constraints += _constraints(f"{name}/{sub}", alternative, demand)
        requests.append({"name": name, "firstAvailable": subrequests})
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"devices": devices}


def template_name(spec: dict[str, Any]) -> str:
    """`hcs-<hash>`: equal claim specs, equal names, in every namespace and webhook replica."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"{TEMPLATE_PREFIX}{digest[:20]}"
