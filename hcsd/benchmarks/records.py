"""What a measurement leaves: its figures, the device they are applied to, and the outcome a
caller of `hcsctl measure` reads.

On the device, the measurement rates the FP16 and BF16 figures (`rated_figures`: the profile's
scaled by measured/profile over the model's typical `gemm_efficiency`, at most 1x; the raw
figure where the model has no profile figure) and these attributes say how it compares, for
every reader of the device (the API, `hcsctl devices`, the ComputeNode, the metrics, the
sub-health checks):
`measured_tflops_fp16`, `measured_ratio` (measured / profile FP16; absent for a model without a
profile figure), `measured_bandwidth_gbps` (absent when not taken), `measured_at` (UTC).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hcsd.model import Device
from hcsd.profiles.database import Profile
from hcsd.profiles.fingerprint import apply_measured, rated_figures

__all__ = [
    "MEASURED_ATTRIBUTES",
    "Measure",
    "Measurement",
    "Outcome",
    "apply_measurement",
    "measured_ratio",
]

MEASURED_ATTRIBUTES = (
    "fingerprint",
    "measured_tflops_fp16",
    "measured_ratio",
    "measured_bandwidth_gbps",
    "measured_at",
)


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass(frozen=True, slots=True)
class Measurement:
    uuid: str
    tflops_fp16: float
    profile_tflops_fp16: float  # 0: the model has no profile figure
    bandwidth_gbps: float | None
    seconds: float
    iterations: int
    size: int
    library: str
    at: float  # when it ended, Unix time

    @property
    def ratio(self) -> float | None:
        """Measured over the profile's FP16 figure; None without a profile figure."""
        if self.profile_tflops_fp16 <= 0:
            return None
        return self.tflops_fp16 / self.profile_tflops_fp16

    def record(self) -> dict[str, Any]:
        """The entry of the measured-figures file (load_measured reads `tflops_fp16`; the rest
        is context it skips)."""
        entry: dict[str, Any] = {
            "tflops_fp16": round(self.tflops_fp16, 3),
            "profile_tflops_fp16": self.profile_tflops_fp16,
            "seconds": round(self.seconds, 6),
            "iterations": self.iterations,
            "size": self.size,
            "library": self.library,
            "measured_at": utc(self.at),
            "at": self.at,
        }
        if self.ratio is not None:
            entry["ratio"] = round(self.ratio, 4)
        if self.bandwidth_gbps is not None:
            entry["memory_bandwidth_gbps"] = round(self.bandwidth_gbps, 1)
        return entry

    @classmethod
    def from_record(cls, uuid: str, entry: dict[str, Any]) -> Measurement:
        """Back from the file; raises (KeyError, TypeError, ValueError) on a malformed entry."""
        bandwidth = entry.get("memory_bandwidth_gbps")
        return cls(
            uuid=uuid,
            tflops_fp16=float(entry["tflops_fp16"]),
            profile_tflops_fp16=float(entry.get("profile_tflops_fp16", 0.0)),
            bandwidth_gbps=float(bandwidth) if bandwidth is not None else None,
            seconds=float(entry.get("seconds", 0.0)),
            iterations=int(entry.get("iterations", 0)),
            size=int(entry.get("size", 0)),
            library=str(entry.get("library", "")),
            at=float(entry.get("at", 0.0)),
        )


def apply_measurement(
    device: Device, measurement: Measurement, profile: Profile | None = None
) -> Device:
    """The device rated by its measurement (`rated_figures`: the profile's FP16 and BF16
    scaled by how the card compares with a typical healthy one of its model) and the
    attributes that describe it; a newer measurement replaces an older one's attributes."""
    kept = tuple((k, v) for k, v in device.attributes if k not in MEASURED_ATTRIBUTES)
    figures = {device.uuid: rated_figures(profile, measurement.tflops_fp16)}
    measured = apply_measured([replace(device, attributes=kept)], figures)[0]
    extra = [("measured_tflops_fp16", f"{measurement.tflops_fp16:.3f}")]
    if measurement.ratio is not None:
        extra.append(("measured_ratio", f"{measurement.ratio:.4f}"))
    if measurement.bandwidth_gbps is not None:
        extra.append(("measured_bandwidth_gbps", f"{measurement.bandwidth_gbps:.1f}"))
    extra.append(("measured_at", utc(measurement.at)))
    return replace(measured, attributes=(*measured.attributes, *extra))


def measured_ratio(device: Device) -> float | None:
    """Measured FP16 TFLOPS over the profile's, from the device's attributes; None when the
    device was not measured or its model has no profile figure. For the sub-health checks: a
    ratio well below 1 is a slow card (down-clocked, throttled, a bad link)."""
    text = dict(device.attributes).get("measured_ratio")
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One device's part in a measuring pass: `measured`, `skipped` (allocated, not healthy,
    no library for its vendor), `failed` (the library or device said no, or time ran out) or
    `aborted` (an allocation took the device meanwhile)."""

    uuid: str
    status: str
    message: str = ""
    measurement: Measurement | None = None


#: Measures the devices named (all when none) and says how each ended (hcsd.daemon.measuring).
Measure = Callable[[Sequence[str]], Awaitable[list[Outcome]]]
