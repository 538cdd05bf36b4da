"""A device's measured figures as its ComputeNode shows them (spec.devices[]: the rating,
`fingerprint`, `measured`): what the node measured, within the bounds the CRD sets, and the
rating taken back to the profile's when the measured figure it came from is refused.

Pure functions, no I/O (objects' node_spec and node_status call them).
"""

from __future__ import annotations

import logging
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.model import Vendor
from hcsd.profiles.database import default_database

__all__ = ["MEASURED_BOUNDS", "fingerprint_of", "measured_of", "published"]

log = logging.getLogger(__name__)

#: crds/computenodes.yaml: spec.devices[].measured's figures, (minimum, maximum). Past them a
#: figure is a broken timing; the API server would refuse the whole spec, so it is left out.
MEASURED_BOUNDS = {
    "tflopsFP16": (0.0, 10_000.0),
    "ratio": (0.0, 10.0),
    "memoryBandwidthGBps": (0.0, 100_000.0),
}


def fingerprint_of(device: pb.Device) -> str:
    """Where the device's throughput figures come from: `measured` on the node (the
    fingerprint attribute hcsd.profiles.fingerprint sets), else `profile` (the database, or
    what the backend reported)."""
    return "measured" if device.attributes.get("fingerprint") == "measured" else "profile"


def published(device: pb.Device) -> pb.Device:
    """The device as its ComputeNode shows it. A measured FP16 figure outside MEASURED_BOUNDS
    is a broken timing; the node rated the device from it (hcsd.profiles.fingerprint's
    apply_measured), so the rating is not published either: FP16 and BF16 go back to the
    profile's figures (FP16 0, not rated, for a model without one: the measured figure was
    used as it was), the fingerprint to `profile`, and the ratio, derived from the same
    figure, is left out. FP32 and INT8 were never measured."""
    if fingerprint_of(device) != "measured" or "measured_tflops_fp16" not in device.attributes:
        return device
    if _figure(device, "measured_tflops_fp16", "tflopsFP16") is not None:
        return device
    try:
        profile = default_database().lookup(Vendor.parse(device.vendor), device.model)
    except ValueError:
        profile = None
    shown = pb.Device()
    shown.CopyFrom(device)
    shown.tflops_fp16 = profile.figure("tflops_fp16") if profile is not None else 0.0
    if profile is not None and profile.figure("tflops_bf16") > 0:
        shown.tflops_bf16 = profile.figure("tflops_bf16")
    del shown.attributes["fingerprint"]
    shown.attributes.pop("measured_ratio", None)
    return shown


def measured_of(device: pb.Device) -> dict[str, Any] | None:
    """The node's own measurement of the device (hcsd.benchmarks' attributes), or None: its FP16
    TFLOPS, the ratio to the profile's figure (the sub-health check's input), its memory
    bandwidth, and when. A figure that is not a number or lies outside MEASURED_BOUNDS is left
    out (warned about once): the API server would refuse the node's whole spec for it."""
    attributes = device.attributes
    if "measured_tflops_fp16" not in attributes:
        return None
    found: dict[str, Any] = {"at": attributes.get("measured_at", "")}
    for key, name in (
        ("measured_tflops_fp16", "tflopsFP16"),
        ("measured_ratio", "ratio"),
        ("measured_bandwidth_gbps", "memoryBandwidthGBps"),
    ):
        if key in attributes and (value := _figure(device, key, name)) is not None:
            found[name] = value
    return found


def _figure(device: pb.Device, key: str, name: str) -> float | None:
    """The attribute's figure when within MEASURED_BOUNDS, else None: warned about once per
    device and figure until it is back within them (so `_refused` holds at most one entry
    per device and figure)."""
    text = device.attributes.get(key, "")
    try:
        value = round(float(text), 4)
    except ValueError:
        value = float("nan")
    low, high = MEASURED_BOUNDS[name]
    if low <= value <= high:  # NaN compares false: refused too
        _refused.pop((device.uuid, name), None)
        return value
    if (device.uuid, name) not in _refused:
        _refused[(device.uuid, name)] = text
        log.warning("%s: measured %s %s outside [%g, %g]; not published", device.uuid,
                    name, text, low, high)  # fmt: skip
    return None


_refused: dict[tuple[str, str], str] = {}  # (uuid, field) -> the text warned about
