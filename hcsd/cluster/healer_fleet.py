"""Slow devices against the fleet: each device's measured efficiency vs its model's median.

A node that measured its own devices says so in its ComputeNode (`spec.devices[].measured`:
the measured FP16 TFLOPS and their ratio to the profile's; or, from a node that publishes
only the figure, `fingerprint: measured` with the measured TFLOPS in `tflopsFP16`). The
efficiency of such a device is that ratio; grouped by model across every ComputeNode, a device
whose efficiency is below the model's median by more than the margin is an outlier: a card
down-clocked, down-trained or throttled that hcsd alone cannot see, since every card on one
node may be the same model. Outliers go to the node's `status.fleet` (written by hcs-controller
through the status subresource; the syncer carries the field over in its own writes), where
the extender scores the devices down and `kubectl get computenodes` shows why.

`efficiency` is the one place that reads the measurement: where the node publishes more
(a ratio of its own, memory bandwidth), only it changes.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.model import Vendor
from hcsd.profiles.database import ProfileDatabase

__all__ = ["FleetPolicy", "efficiency", "fleet_status", "outliers"]


@dataclass(frozen=True, slots=True)
class FleetPolicy:
    margin: float = 0.15  # below the median by more than this share: slow
    min_devices: int = 3  # measured devices of a model before its median means anything


def efficiency(device: Mapping[str, Any], db: ProfileDatabase) -> float | None:
    """Measured FP16 TFLOPS over the model's profile figure: the node's own ratio
    (`measured.ratio`), else its measured figure over the profile database's; None when the
    node did not measure the device or there is no profile figure to compare with."""
    own = device.get("measured") or {}
    if own.get("ratio"):
        return float(own["ratio"])
    if own.get("tflopsFP16"):
        measured = float(own["tflopsFP16"])
    elif device.get("fingerprint") == "measured":  # a node that publishes only the figure
        measured = float(device.get("tflopsFP16") or 0.0)
    else:
        return None
    try:
        vendor = Vendor.parse(str(device.get("vendor", "")))
    except ValueError:
        return None
    profile = db.lookup(vendor, str(device.get("model", "")))
    reference = profile.figure("tflops_fp16") if profile is not None else 0.0
    if measured <= 0 or reference <= 0:
        return None
    return measured / reference


@dataclass(frozen=True, slots=True)
class Outlier:
    node: str
    uuid: str
    model: str
    efficiency: float
    median: float

    def entry(self, margin: float) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "model": self.model,
            "efficiency": round(self.efficiency, 3),
            "fleetMedian": round(self.median, 3),
            "reason": (
                f"measured {self.efficiency:.0%} of the profile's FP16 TFLOPS; the fleet median "
                f"of {self.model} is {self.median:.0%} (margin {margin:.0%})"
            ),
        }


def outliers(
    nodes: Iterable[Mapping[str, Any]], db: ProfileDatabase, policy: FleetPolicy
) -> list[Outlier]:
    """Every measured device below its model's fleet median by more than the margin."""
    by_model: dict[str, list[tuple[str, str, str, float]]] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        for device in (node.get("spec") or {}).get("devices") or ():
            ratio = efficiency(device, db)
            if ratio is not None:
                model = str(device.get("model", ""))
                by_model.setdefault(model.lower(), []).append(
                    (name, str(device.get("uuid", "")), model, ratio)
                )
    found: list[Outlier] = []
    for measured in by_model.values():
        if len(measured) < policy.min_devices:
            continue
        median = statistics.median(ratio for *_, ratio in measured)
        for where, uuid, model, ratio in measured:
            if ratio < median * (1.0 - policy.margin):
                found.append(Outlier(where, uuid, model, ratio, median))
    return sorted(found, key=lambda o: (o.node, o.uuid))


def fleet_status(found: Iterable[Outlier], policy: FleetPolicy) -> dict[str, Any] | None:
    """A node's `status.fleet` for its outliers (None: the field removed)."""
    entries = [o.entry(policy.margin) for o in found]
    if not entries:
        return None
    shown = ", ".join(
        f"{e['uuid'][:12]} {e['efficiency']:.0%}/{e['fleetMedian']:.0%}" for e in entries
    )
    return {"slowDevices": entries, "summary": f"{len(entries)} slow: {shown}"[:256]}
