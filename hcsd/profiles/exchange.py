"""Exchange rates: how many devices of each model meet a need, and rates between two models.

A need is what a user writes: `100 TFLOPS fp16`, `vram 160Gi`, `500 ACU` or `2 nvidia/A100-80G`
(that many devices of a model: converted through its FP16 figure). The answer is a pure
function of the profile database.

The one conversion between amounts and devices, used by `hcsctl convert` (below), the
allocator (hcsd and the scheduler extender place TFLOPS requests with it) and the extender's
substitution and quota accounting:
- `devices_for`: whole devices of a model that meet an amount;
- `share_percent`: the share of one device that meets an amount smaller than it;
- `share_tflops`: what a share of a device is worth (the inverse, for quotas);
- `devices_as_tflops`: what N devices of a named model stand for (N x its dense FP16).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from hcsd.profiles.database import FIGURES, Profile, ProfileDatabase
from hcsd.quantity import QuantityError, parse_bytes

__all__ = [
    "Conversion",
    "ConversionError",
    "Need",
    "Option",
    "Rate",
    "convert",
    "devices_as_tflops",
    "devices_for",
    "parse_need",
    "share_percent",
    "share_tflops",
]

_UNITS = {"tflops": "tflops", "tops": "tops", "acu": "acu"}
_PRECISIONS = {"tflops": ("fp16", "bf16", "fp32"), "tops": ("int8",)}
_NUMBER = r"(?P<amount>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# Float noise: 3 x 312 TFLOPS over 312 per device must be 3 devices, not 4.
_EPSILON = 1e-9


def devices_for(amount: float, per_device: float) -> int:
    """Whole devices, `per_device` each, that meet `amount`: at least one."""
    return max(1, math.ceil(amount / per_device - _EPSILON))


def share_percent(amount: float, per_device: float) -> int:
    """The share of one device, in whole percent rounded up, that meets `amount` (at most 100)."""
    return min(100, math.ceil(amount / per_device * 100 - _EPSILON))


def share_tflops(tflops_fp16: float, percent: int) -> float:
    """FP16 TFLOPS that `percent` of a device of `tflops_fp16` is worth."""
    return tflops_fp16 * percent / 100.0


def devices_as_tflops(devices: float, models: Iterable[Profile]) -> float | None:
    """FP16 TFLOPS that `devices` devices of a named model stand for: that many times its dense
    FP16. A name may denote several models (`ascend/910B`): the weakest stands for it. None
    when none of them publishes an FP16 figure."""
    figures = [p.figure("tflops_fp16") for p in models]
    figures = [f for f in figures if f > 0]
    if not figures:
        return None
    return devices * min(figures)


class ConversionError(ValueError):
    """A need or a target model that cannot be understood."""


@dataclass(frozen=True, slots=True)
class Need:
    figure: str  # one of FIGURES, "vram_bytes" or "acu"
    amount: float
    text: str
    model: Profile | None = None  # set for "N vendor/model"


@dataclass(frozen=True, slots=True)
class Option:
    profile: Profile
    per_device: float
    devices: int
    acu_per_device: float


@dataclass(frozen=True, slots=True)
class Rate:
    source: Profile
    target: Profile
    figure: str
    rate: float  # target devices per source device


@dataclass(frozen=True, slots=True)
class Conversion:
    need: Need
    options: tuple[Option, ...]
    skipped: tuple[tuple[Profile, str], ...]
    rates: tuple[Rate, ...]


def parse_need(text: str, db: ProfileDatabase) -> Need:
    words = text.strip().split()
    lowered = [w.lower() for w in words]
    if len(words) == 2 and "vram" in lowered:
        quantity = words[1 - lowered.index("vram")]
        try:
            return Need("vram_bytes", float(parse_bytes(quantity, what="vram")), text)
        except QuantityError as e:
            raise ConversionError(str(e)) from e
    match = re.fullmatch(_NUMBER + r"\s*(?:x\s+)?(?P<rest>.+)", text.strip(), re.IGNORECASE)
    if match is None:
        raise ConversionError(f"cannot read need {text!r}: {_HELP}")
    amount = float(match["amount"])
    if not amount > 0:
        raise ConversionError(f"need {text!r}: the amount must be positive")
    rest = match["rest"].strip().lower().split()
    if rest and rest[0] in _UNITS:
        unit = _UNITS[rest[0]]
        if unit == "acu":
            if len(rest) != 1:
                raise ConversionError(f"cannot read need {text!r}: {_HELP}")
            return Need("acu", amount, text)
        precision = rest[1] if len(rest) > 1 else _PRECISIONS[unit][0]
        if len(rest) > 2 or precision not in _PRECISIONS[unit]:
            choices = ", ".join(_PRECISIONS[unit])
            raise ConversionError(f"need {text!r}: {rest[0].upper()} takes one of {choices}")
        return Need(f"{unit}_{precision}", amount, text)
    if amount != int(amount):
        raise ConversionError(f"need {text!r}: a number of devices must be whole")
    model = _one(db, match["rest"].strip())
    tflops = devices_as_tflops(amount, [model])
    if tflops is None:
        raise ConversionError(f"need {text!r}: {model.key} publishes no FP16 TFLOPS")
    return Need("tflops_fp16", tflops, text, model=model)


_HELP = "write e.g. '100 TFLOPS fp16', '400 TOPS int8', 'vram 160Gi', '500 ACU' or '2 nvidia/A100'"


def _one(db: ProfileDatabase, spec: str) -> Profile:
    try:
        found = db.find(spec)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    if len(found) != 1:
        names = ", ".join(p.key for p in found) or "none"
        raise ConversionError(f"{spec!r} must name one model (matches: {names})")
    return found[0]


def convert(need: Need, db: ProfileDatabase, *, to: str | None = None) -> Conversion:
    """Devices of each model (or of the models `to` names) that meet `need`."""
    try:
        targets = db.find(to) if to else list(db.profiles)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    if to and not targets:
        raise ConversionError(f"no model matches {to!r}")
    figure = "tflops_fp16" if need.figure == "acu" else need.figure
    amount = need.amount * db.acu_tflops if need.figure == "acu" else need.amount
    options, skipped = [], []
    for profile in targets:
        per_device = float(profile.vram_bytes) if figure == "vram_bytes" else profile.figure(figure)
        if per_device <= 0:
            skipped.append((profile, f"no published {figure}"))
            continue
        devices = devices_for(amount, per_device)
        options.append(Option(profile, per_device, devices, db.acu(profile)))
    options.sort(key=lambda o: (o.devices, -o.per_device, o.profile.key))
    base = need.model or db.reference
    rate_figure = figure if figure in FIGURES else "tflops_fp16"
    rates = []
    if to:
        for target in targets:
            if target.figure(rate_figure) > 0 and base.figure(rate_figure) > 0:
                value = base.figure(rate_figure) / target.figure(rate_figure)
                rates.append(Rate(base, target, rate_figure, value))
    return Conversion(need, tuple(options), tuple(skipped), tuple(rates))
