"""ComputeQuota: per-namespace limits on accelerator VRAM, FP16 TFLOPS and devices.

What a pod uses is counted from its grants (what it really got), not from its request: a
whole-device request holds the whole device's VRAM. TFLOPS count a grant's reserved share of
the device (`compute` percent, 100 for whole devices); a VRAM-only slice with no reservation
counts 0 TFLOPS because it reserves none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.contract.names import QUOTA_DEVICES, QUOTA_KEYS, QUOTA_TFLOPS, QUOTA_VRAM
from hcsd.quantity import QuantityError, format_bytes, parse_bytes, parse_quantity

__all__ = ["Amounts", "Quota", "QuotaError", "quota_of"]


class QuotaError(ValueError):
    """A ComputeQuota whose spec cannot be read."""


@dataclass(frozen=True, slots=True)
class Amounts:
    vram: int = 0
    tflops: float = 0.0
    devices: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(
            self.vram + other.vram, self.tflops + other.tflops, self.devices + other.devices
        )

    def as_status(self) -> dict[str, str]:
        return {
            QUOTA_VRAM: format_bytes(self.vram),
            QUOTA_TFLOPS: f"{self.tflops:.6g}",
            QUOTA_DEVICES: str(self.devices),
        }


@dataclass(frozen=True, slots=True)
class Quota:
    namespace: str
    name: str
    hard: Mapping[str, float]  # only the keys the spec sets
    status_used: Mapping[str, str]

    def excess(self, used: Amounts, adding: Amounts) -> str | None:
        """Why `adding` on top of `used` breaks this quota, or None."""
        values = {
            QUOTA_VRAM: (used.vram, adding.vram, format_bytes),
            QUOTA_TFLOPS: (used.tflops, adding.tflops, lambda v: f"{v:.6g}"),
            QUOTA_DEVICES: (used.devices, adding.devices, lambda v: str(int(v))),
        }
        for key, limit in self.hard.items():
            have, want, fmt = values[key]
            if want and have + want > limit + 1e-9:
                return (
                    f"ComputeQuota {self.namespace}/{self.name}: {key} {fmt(have)} used + "
                    f"{fmt(want)} requested exceeds the limit {fmt(limit)}"
                )
        return None


def quota_of(obj: Mapping[str, Any]) -> Quota:
    meta = obj.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    hard_raw = ((obj.get("spec") or {}).get("hard")) or {}
    if not isinstance(hard_raw, Mapping):
        raise QuotaError(f"ComputeQuota {name}: spec.hard must be a map")
    hard: dict[str, float] = {}
    for key, value in hard_raw.items():
        if key not in QUOTA_KEYS:
            raise QuotaError(f"ComputeQuota {name}: unknown key {key!r} in spec.hard")
        try:
            if key == QUOTA_VRAM:
                hard[key] = float(parse_bytes(str(value), what=key))
            else:
                hard[key] = float(parse_quantity(str(value)))
        except QuantityError as e:
            raise QuotaError(f"ComputeQuota {name}: {e}") from e
    used = ((obj.get("status") or {}).get("used")) or {}
    return Quota(str(meta.get("namespace")), str(meta.get("name")), hard, dict(used))
