"""Exchange rates: how many devices of each model meet a need, and rates between two models.

A need is what a user writes: `100 TFLOPS fp16`, `vram 160Gi`, `500 ACU` or `2 nvidia/A100-80G`
(that many devices of a model: converted through its FP16 figure). The answer is a pure
function of the profile database, so hcsctl, the scheduler extender and tests agree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hcsd.profiles.database import FIGURES, Profile, ProfileDatabase
from hcsd.quantity import QuantityError, parse_bytes

__all__ = ["Conversion", "ConversionError", "Need", "Option", "Rate", "convert", "parse_need"]

_UNITS = {"tflops": "tflops", "tops": "tops", "acu": "acu"}
_PRECISIONS = {"tflops": ("fp16", "bf16", "fp32"), "tops": ("int8",)}
_NUMBER = r"(?P<amount>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"


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
    return Need("tflops_fp16", amount * model.figure("tflops_fp16"), text, model=model)


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
        devices = max(1, math.ceil(amount / per_device - 1e-9))
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
