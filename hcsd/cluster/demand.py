"""What a pod asks of the accelerators: its `ai.compute/*` resources and `hcs.io/*` hints.

Read defensively: the pod spec comes from users, and every mistake must come back as one
sentence the user can act on (it ends up in the pod's Unschedulable condition verbatim).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hcsd.contract.names import (
    ANNOTATION_MODELS,
    ANNOTATION_SUBSTITUTION,
    ANNOTATION_TOPOLOGY,
    ANNOTATION_VENDORS,
    RESOURCE_DEVICES,
    RESOURCE_TFLOPS,
    RESOURCE_VRAM,
    model_names,
)
from hcsd.model import Request, TopologyPreference, Vendor
from hcsd.quantity import QuantityError, parse_bytes, parse_quantity

__all__ = ["ContainerDemand", "Cover", "Demand", "DemandError", "demand_of"]

MAX_DEVICES = 64


class DemandError(ValueError):
    """The pod's accelerator request cannot be understood."""


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    name: str
    vram_bytes: int | None  # per device
    devices: int
    tflops_fp16: float | None  # total


@dataclass(frozen=True, slots=True)
class Cover:
    """Which devices a pod's RuntimeProfile has an image for: its entries' (vendor, models),
    in the profile's order (no models: any model of the vendor; models lower-cased, aliases
    expanded). A pod with a profile is placed only on devices one entry admits, so its bind
    always finds an image (hcsd/cluster/runtime_profiles.py)."""

    profile: str
    entries: tuple[tuple[Vendor, frozenset[str]], ...]

    def entry_for(self, vendor: str, model: str) -> int | None:
        """The index of the first entry that admits a device of `vendor` (a `Vendor` or its
        value) and `model`."""
        lowered = model.lower()
        for i, (entry_vendor, models) in enumerate(self.entries):
            if entry_vendor == vendor and (not models or lowered in models):
                return i
        return None

    def admits(self, vendor: str, model: str) -> bool:
        return self.entry_for(vendor, model) is not None

    def describe(self) -> str:
        """The entries as a user reads them: "nvidia (a100-sxm4-80gb), ascend"."""
        return ", ".join(
            f"{vendor.value} ({', '.join(sorted(models))})" if models else vendor.value
            for vendor, models in self.entries
        )


@dataclass(frozen=True, slots=True)
class Demand:
    """Hashable, so decisions can be cached per (node shape, demand)."""

    namespace: str
    containers: tuple[ContainerDemand, ...]
    vendors: frozenset[Vendor]
    models: frozenset[str]
    substitution: bool
    topology: TopologyPreference
    # The pod's RuntimeProfile's reach (`hcs.io/runtime-profile`), resolved by the Decider;
    # None: the pod names no profile.
    cover: Cover | None = None

    def request(self, container: ContainerDemand, *, strict: bool = True) -> Request:
        """The allocator's request for one container (allow-lists dropped when not strict)."""
        return Request(
            container_id=container.name,
            vram_bytes=container.vram_bytes,
            devices=container.devices,
            tflops_fp16=container.tflops_fp16,
            vendors=self.vendors if strict else frozenset(),
            models=self.models if strict else frozenset(),
            topology=self.topology,
        )

    @property
    def vram_floor(self) -> int:
        """VRAM the pod needs at least, whatever node it lands on (for a quick quota check)."""
        return sum((c.vram_bytes or 0) * c.devices for c in self.containers)


def _quantity(container: str, resources: Mapping[str, Any], name: str) -> str | None:
    value = resources.get(name)
    if value is None:
        return None
    if not isinstance(value, (str, int, float)):
        raise DemandError(f"container {container}: {name} must be a quantity, got {value!r}")
    return str(value)


def _container(raw: Mapping[str, Any]) -> ContainerDemand | None:
    name = str(raw.get("name", ""))
    resources = raw.get("resources") or {}
    # Extended resources must be limits (requests default to them); read limits first.
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    vram_text = _quantity(name, merged, RESOURCE_VRAM)
    tflops_text = _quantity(name, merged, RESOURCE_TFLOPS)
    devices_text = _quantity(name, merged, RESOURCE_DEVICES)
    if vram_text is None and tflops_text is None and devices_text is None:
        return None
    try:
        vram = parse_bytes(vram_text, what=RESOURCE_VRAM) if vram_text is not None else None
        tflops_value = parse_quantity(tflops_text) if tflops_text is not None else None
        devices_value = parse_quantity(devices_text) if devices_text is not None else Decimal(1)
    except QuantityError as e:
        raise DemandError(f"container {name}: {e}") from e
    if vram is not None and vram <= 0:
        raise DemandError(f"container {name}: {RESOURCE_VRAM} must be positive")
    if devices_value != devices_value.to_integral_value() or not 1 <= devices_value <= MAX_DEVICES:
        raise DemandError(
            f"container {name}: {RESOURCE_DEVICES} must be a whole number 1..{MAX_DEVICES}, "
            f"got {devices_text}"
        )
    tflops = None
    if tflops_value is not None:
        tflops = float(tflops_value)
        if not (tflops > 0 and math.isfinite(tflops)):
            raise DemandError(f"container {name}: {RESOURCE_TFLOPS} must be positive")
    return ContainerDemand(name, vram, int(devices_value), tflops)


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]


def demand_of(pod: Mapping[str, Any]) -> Demand | None:
    """The pod's demand; None when it asks for no accelerator; DemandError when malformed."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    containers = tuple(
        c for c in (_container(raw) for raw in (pod.get("spec") or {}).get("containers") or ()) if c
    )
    if not containers:
        return None
    try:
        vendors = frozenset(
            Vendor.parse(v) for v in _words(annotations.get(ANNOTATION_VENDORS, ""))
        )
    except ValueError as e:
        raise DemandError(f"{ANNOTATION_VENDORS}: {e}") from e
    try:
        models = frozenset(
            m.lower() for m in model_names(str(annotations.get(ANNOTATION_MODELS, "")))
        )
    except ValueError as e:
        raise DemandError(str(e)) from e
    substitution_text = str(annotations.get(ANNOTATION_SUBSTITUTION, "false")).strip().lower()
    if substitution_text not in ("true", "false"):
        raise DemandError(
            f'{ANNOTATION_SUBSTITUTION} must be "true" or "false", got {substitution_text!r}'
        )
    topology_text = str(annotations.get(ANNOTATION_TOPOLOGY, "")).strip()
    try:
        topology = TopologyPreference(topology_text)
    except ValueError:
        raise DemandError(
            f'{ANNOTATION_TOPOLOGY} must be "high-bandwidth" or empty, got {topology_text!r}'
        ) from None
    return Demand(
        namespace=str(meta.get("namespace", "")),
        containers=containers,
        vendors=vendors,
        models=models,
        substitution=substitution_text == "true",
        topology=topology,
    )
