"""A device's throughput figures: from the profile database, or measured on this node.

Backends name a model the way its management library spells it; this turns that name into the
figures the allocator and the exchange rates use. An unknown model keeps its raw name and its
raw figures (VRAM, clocks) and is marked `profile=unknown` with a warning: its TFLOPS stay
unknown rather than guessed, and TFLOPS requests refuse it with a reason (`unknown_tflops`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hcsd.model import Device, Vendor
from hcsd.profiles.database import FIGURES, ProfileDatabase, default_database

__all__ = ["Fingerprint", "MeasurementError", "apply_measured", "fingerprint", "load_measured"]

log = logging.getLogger(__name__)
_warned: set[tuple[Vendor, str]] = set()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    model: str
    figures: Mapping[str, float]
    attributes: tuple[tuple[str, str], ...]
    known: bool

    def apply(self, device: Device) -> Device:
        """The device with this model name, these figures and the profile attributes added."""
        return replace(
            device,
            model=self.model,
            tflops_fp16=self.figures.get("tflops_fp16", 0.0),
            tflops_bf16=self.figures.get("tflops_bf16", 0.0),
            tflops_fp32=self.figures.get("tflops_fp32", 0.0),
            tops_int8=self.figures.get("tops_int8", 0.0),
            attributes=(*device.attributes, *self.attributes),
        )


def fingerprint(
    vendor: Vendor, raw_name: str, *, database: ProfileDatabase | None = None
) -> Fingerprint:
    db = database or default_database()
    profile = db.lookup(vendor, raw_name)
    if profile is None:
        name = raw_name.strip() or "unknown"
        if (vendor, name) not in _warned:
            _warned.add((vendor, name))
            log.warning(
                "%s model %r is not in the profile database: reported with its raw figures; "
                "TFLOPS requests and exchange rates cannot use it until it is added",
                vendor.value,
                name,
            )
        return Fingerprint(name, {}, (("profile", "unknown"),), known=False)
    attributes = (("profile", profile.key), ("profile_confidence", profile.confidence))
    return Fingerprint(profile.model, dict(profile.figures), attributes, known=True)


class MeasurementError(ValueError):
    """The measured-fingerprint file is unreadable or malformed."""


def load_measured(path: Path) -> dict[str, dict[str, float]]:
    """`{uuid: {"tflops_fp16": 301.2, ...}}` as written by a node's own micro-benchmark."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MeasurementError(f"failed to read measurements {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise MeasurementError(f"failed to parse measurements {path}: {e}") from e
    if not isinstance(data, dict):
        raise MeasurementError(f"{path}: expected an object of device uuids")
    result: dict[str, dict[str, float]] = {}
    for uuid, values in data.items():
        if not isinstance(values, dict):
            raise MeasurementError(f"{path}: {uuid}: expected an object of figures")
        figures = {}
        for name, value in values.items():
            if name not in FIGURES:
                continue  # extra context (timestamps, sizes) is allowed
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise MeasurementError(f"{path}: {uuid}.{name}: expected a positive number")
            figures[name] = float(value)
        result[str(uuid)] = figures
    return result


def apply_measured(
    devices: Sequence[Device], measured: Mapping[str, Mapping[str, float]]
) -> list[Device]:
    """Measured figures win over profile figures, device by device."""
    result = []
    for device in devices:
        figures = measured.get(device.uuid)
        if not figures:
            result.append(device)
            continue
        attributes = (*device.attributes, ("fingerprint", "measured"))
        result.append(
            replace(
                device,
                attributes=attributes,
                tflops_fp16=figures.get("tflops_fp16", device.tflops_fp16),
                tflops_bf16=figures.get("tflops_bf16", device.tflops_bf16),
                tflops_fp32=figures.get("tflops_fp32", device.tflops_fp32),
                tops_int8=figures.get("tops_int8", device.tops_int8),
            )
        )
    return result
