"""A device's throughput figures: from the profile database, or measured on this node.

Backends name a model the way its management library spells it; this turns that name into the
figures the allocator and the exchange rates use. An unknown model keeps its raw name and its
raw figures (VRAM, clocks) and is marked `profile=unknown` with a warning: its TFLOPS stay
unknown rather than guessed, and TFLOPS requests refuse it with a reason (`unknown_tflops`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hcsd.model import Device, Vendor
from hcsd.profiles.database import FIGURES, Profile, ProfileDatabase, default_database

__all__ = [
    "Fingerprint",
    "MeasurementError",
    "apply_measured",
    "fingerprint",
    "load_measured",
    "parse_measured",
    "rated_figures",
]

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
        data = path.read_bytes()
    except OSError as e:
        raise MeasurementError(f"failed to read measurements {path}: {e.strerror}") from e
    return parse_measured(data, str(path))


def _no_constant(name: str) -> object:
    raise MeasurementError(f"{name} is not a figure")


def parse_measured(data: bytes, where: str) -> dict[str, dict[str, float]]:
    """The figures in the file's bytes; every fault (not UTF-8, not JSON, NaN, Infinity, a
    figure that is not a finite positive number) is a MeasurementError naming `where`."""
    try:
        parsed = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise MeasurementError(f"failed to parse measurements {where}: not UTF-8 ({e})") from e
    except json.JSONDecodeError as e:
        raise MeasurementError(f"failed to parse measurements {where}: {e}") from e
    except MeasurementError as e:
        raise MeasurementError(f"failed to parse measurements {where}: {e}") from e
    if not isinstance(parsed, dict):
        raise MeasurementError(f"{where}: expected an object of device uuids")
    result: dict[str, dict[str, float]] = {}
    for uuid, values in parsed.items():
        if not isinstance(values, dict):
            raise MeasurementError(f"{where}: {uuid}: expected an object of figures")
        figures = {}
        for name, value in values.items():
            if name not in FIGURES:
                continue  # extra context (timestamps, sizes) is allowed
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise MeasurementError(f"{where}: {uuid}.{name}: expected a positive number")
            if not math.isfinite(value) or value <= 0:
                raise MeasurementError(
                    f"{where}: {uuid}.{name}: expected a positive number, not {value}"
                )
            figures[name] = float(value)
        result[str(uuid)] = figures
    return result


def rated_figures(profile: Profile | None, measured_fp16: float) -> dict[str, float]:
    """The figures a device measured at `measured_fp16` is rated at, for the exchange rates.

    A measured GEMM reaches only part of a datasheet peak (a healthy H100 SXM: ~0.6-0.8 of its
    989), so the raw figure would rate a measured card below an unmeasured one of the same
    model. Instead the profile figure is scaled by how this card compares with a typical
    healthy one: (measured / profile) / the model's `gemm_efficiency`, at most 1 (a card is
    never rated above its datasheet). BF16 is scaled by the same factor (the same tensor
    units); FP32 and INT8 keep their profile figures (not measured). Without a profile FP16
    figure there is nothing to scale: the measured figure is used as it is."""
    peak = profile.figure("tflops_fp16") if profile is not None else 0.0
    if profile is None or peak <= 0:
        return {"tflops_fp16": measured_fp16}
    scale = min(1.0, measured_fp16 / peak / profile.gemm_efficiency)
    figures = {"tflops_fp16": round(peak * scale, 3)}
    if profile.figure("tflops_bf16") > 0:
        figures["tflops_bf16"] = round(profile.figure("tflops_bf16") * scale, 3)
    return figures


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
