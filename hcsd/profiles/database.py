"""Loading and looking up the profile database (`hcsd/data/profiles.toml`).

The figures are data, not code, so that an operator can check each one against its source and
ship a corrected file without a release. Loading is strict: a figure without a source, a
negative number or an unknown key is an error naming the model, because a wrong exchange rate
silently moves work to the wrong hardware.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hcsd.model import Vendor
from hcsd.quantity import QuantityError, parse_bytes

__all__ = [
    "DEFAULT_GEMM_EFFICIENCY",
    "FIGURES",
    "Profile",
    "ProfileDatabase",
    "ProfileError",
    "default_database",
    "normalise_name",
]

#: Throughput figures a profile may carry, all dense (no sparsity).
FIGURES = ("tflops_fp16", "tflops_bf16", "tflops_fp32", "tops_int8")
_CONFIDENCE = ("datasheet", "derived", "reported")
#: The share of a model's FP16 datasheet figure a healthy card typically reaches in hcsd's GEMM
#: (vendor library, 8192^3): an estimate (an H100 SXM measures ~0.6-0.8 of its 989), to be
#: replaced per model by the measured median of a fleet (`gemm_efficiency` in a [[model]]).
DEFAULT_GEMM_EFFICIENCY = 0.7
_MODEL_KEYS = {
    "vendor",
    "model",
    "aliases",
    "vram",
    "memory_bandwidth",
    *FIGURES,
    "unpublished",
    "interconnect",
    "source",
    "sources",
    "confidence",
    "gemm_efficiency",
}
_VENDOR_PREFIXES = ("nvidia", "huawei", "ascend", "hygon", "cambricon", "tesla", "dcu")


class ProfileError(ValueError):
    """The profile database file is unreadable or has a bad entry."""


def normalise_name(name: str) -> str:
    """The matching key of a model name: lower case, no separators, no leading vendor name."""
    key = re.sub(r"[\s_\-]+", "", name.strip().lower())
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix) :]
            break
    return key


@dataclass(frozen=True, slots=True)
class Profile:
    """One chip model's published figures; a figure not published is absent from `figures`."""

    vendor: Vendor
    model: str
    vram_bytes: int
    memory_bandwidth: float  # GB/s
    figures: Mapping[str, float]
    source: str
    confidence: str
    interconnect: str = ""
    aliases: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    #: Measured over datasheet FP16 a healthy card of this model typically reaches.
    gemm_efficiency: float = DEFAULT_GEMM_EFFICIENCY

    @property
    def key(self) -> str:
        return f"{self.vendor.value}/{self.model}"

    def figure(self, name: str) -> float:
        """A figure by name, 0.0 where the vendor publishes none."""
        return self.figures.get(name, 0.0)

    def source_of(self, name: str) -> str:
        return self.sources.get(name, self.source)


class ProfileDatabase:
    """All profiles, indexed by vendor and normalised alias."""

    def __init__(self, profiles: Iterable[Profile], *, reference: str, percent: float) -> None:
        self.profiles = tuple(profiles)
        self._index: dict[tuple[Vendor, str], Profile] = {}
        for profile in self.profiles:
            for name in (profile.model, *profile.aliases):
                key = (profile.vendor, normalise_name(name))
                other = self._index.get(key)
                if other is not None and other is not profile:
                    raise ProfileError(f"alias {name!r} names both {other.key} and {profile.key}")
                self._index[key] = profile
        matches = self.find(reference)
        if len(matches) != 1:
            raise ProfileError(f"ACU reference {reference!r} must name exactly one model")
        self.reference = matches[0]
        if not 0 < percent <= 100 or self.reference.figure("tflops_fp16") <= 0:
            raise ProfileError("ACU: percent must be in (0, 100] of a reference with FP16 TFLOPS")
        #: FP16 TFLOPS in one ACU (3.12 for 1% of an A100's 312).
        self.acu_tflops = self.reference.figure("tflops_fp16") * percent / 100.0

    def lookup(self, vendor: Vendor, name: str) -> Profile | None:
        """The profile a management library's model name denotes, or None if unknown."""
        return self._index.get((vendor, normalise_name(name)))

    def find(self, spec: str) -> list[Profile]:
        """Profiles a user's `vendor/model` names: an exact alias, else every model it prefixes
        (so `ascend/910B` lists B1 to B4). A bare model name searches every vendor."""
        vendor_text, _, name = spec.rpartition("/")
        vendors = [Vendor.parse(vendor_text)] if vendor_text else list(Vendor)
        key = normalise_name(name)
        exact = [p for v in vendors if (p := self._index.get((v, key))) is not None]
        if exact or not key:
            return exact
        return [
            p
            for p in self.profiles
            if p.vendor in vendors and normalise_name(p.model).startswith(key)
        ]

    def acu(self, profile: Profile) -> float:
        return profile.figure("tflops_fp16") / self.acu_tflops

    @classmethod
    def load(cls, path: Path | None = None) -> ProfileDatabase:
        """Read a database file; None reads the one shipped with hcsd."""
        where = str(path) if path else "hcsd/data/profiles.toml"
        try:
            if path is None:
                text = resources.files("hcsd").joinpath("data/profiles.toml").read_text("utf-8")
            else:
                text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except OSError as e:
            raise ProfileError(f"failed to read profile database {where}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"failed to parse profile database {where}: {e}") from e
        try:
            acu = dict(data.get("acu", {}))
            profiles = [_profile(raw) for raw in data.get("model", [])]
            return cls(
                profiles,
                reference=str(acu.get("reference", "nvidia/A100-SXM4-80GB")),
                percent=float(acu.get("percent", 1.0)),
            )
        except (ProfileError, ValueError, TypeError) as e:
            raise ProfileError(f"profile database {where}: {e}") from e


@functools.cache
def default_database() -> ProfileDatabase:
    """The shipped database, read once per process."""
    return ProfileDatabase.load()


def _profile(raw: Any) -> Profile:
    if not isinstance(raw, dict):
        raise ProfileError("each [[model]] must be a table")
    label = f"{raw.get('vendor')}/{raw.get('model')}"
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise ProfileError(f"{label}: unknown key(s) {', '.join(sorted(unknown))}")
    try:
        vendor = Vendor.parse(str(raw["vendor"]))
        model = str(raw["model"])
        vram = parse_bytes(str(raw["vram"]), what="vram")
    except (KeyError, QuantityError, ValueError) as e:
        raise ProfileError(f"{label}: {e}") from e
    figures = {name: _number(label, name, raw[name]) for name in FIGURES if name in raw}
    unpublished = set(raw.get("unpublished", []))
    if unpublished & set(figures) or unpublished - set(FIGURES):
        raise ProfileError(f"{label}: `unpublished` must list only figures that are absent")
    missing = set(FIGURES) - set(figures) - unpublished
    if missing:
        raise ProfileError(f"{label}: give or list as unpublished: {', '.join(sorted(missing))}")
    source = str(raw.get("source", ""))
    sources = {str(k): str(v) for k, v in dict(raw.get("sources", {})).items()}
    if not source and not all(name in sources for name in figures):
        raise ProfileError(f"{label}: every figure needs a source")
    efficiency = raw.get("gemm_efficiency", DEFAULT_GEMM_EFFICIENCY)
    if isinstance(efficiency, bool) or not isinstance(efficiency, int | float):
        raise ProfileError(f"{label}: gemm_efficiency must be a number in (0, 1]")
    if not 0 < efficiency <= 1:
        raise ProfileError(f"{label}: gemm_efficiency must be in (0, 1], got {efficiency!r}")
    confidence = str(raw.get("confidence", ""))
    if confidence not in _CONFIDENCE:
        raise ProfileError(f"{label}: confidence must be one of {', '.join(_CONFIDENCE)}")
    return Profile(
        vendor=vendor,
        model=model,
        vram_bytes=vram,
        memory_bandwidth=_number(label, "memory_bandwidth", raw.get("memory_bandwidth", 0)),
        figures=figures,
        source=source,
        confidence=confidence,
        interconnect=str(raw.get("interconnect", "")),
        aliases=tuple(str(a) for a in raw.get("aliases", [])),
        sources=sources,
        gemm_efficiency=float(efficiency),
    )


def _number(label: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ProfileError(f"{label}: {name} must be a non-negative number, got {value!r}")
    return float(value)
