"""What a device can give out, and the check every new allocation passes against it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hcsd.ledger.errors import OverCapacity
from hcsd.model import Allocation
from hcsd.quantity import format_bytes

__all__ = ["Capacity", "check_capacity"]


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one device can give out."""

    vram_bytes: int
    compute_percent: int = 100


def check_capacity(
    allocation: Allocation,
    capacities: Mapping[str, Capacity],
    vram_used: Callable[[str], int],
    compute_used: Callable[[str], int],
) -> None:
    """Raise OverCapacity unless every grant fits what its device has left."""
    if not allocation.grants:
        raise OverCapacity(f"container {allocation.container_id}: an allocation needs grants")
    seen: set[str] = set()
    for grant in allocation.grants:
        uuid = grant.device_uuid
        if uuid in seen:
            raise OverCapacity(f"device {uuid} appears twice in one allocation")
        seen.add(uuid)
        capacity = capacities.get(uuid)
        if capacity is None:
            raise OverCapacity(f"device {uuid} is not on this node")
        if grant.vram_bytes <= 0 or not 0 <= grant.compute_percent <= 100:
            raise OverCapacity(f"device {uuid}: a grant needs positive VRAM and 0..100%")
        free = capacity.vram_bytes - vram_used(uuid)
        if grant.vram_bytes > free:
            raise OverCapacity(
                f"device {uuid}: {format_bytes(grant.vram_bytes)} of VRAM requested, "
                f"{format_bytes(max(free, 0))} free of {format_bytes(capacity.vram_bytes)}"
            )
        compute_free = capacity.compute_percent - compute_used(uuid)
        if grant.compute_percent > compute_free:
            raise OverCapacity(
                f"device {uuid}: {grant.compute_percent}% compute requested, "
                f"{max(compute_free, 0)}% free"
            )
