"""Shared fixtures: the simulated mixed node and small device builders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hcsd.discovery import Inventory, discover_all
from hcsd.discovery.backends.simulated import SimulatedBackend
from hcsd.ledger import Ledger
from hcsd.model import Device, HealthState, Link, LinkKind, Vendor

ROOT = Path(__file__).resolve().parent.parent
MIXED_NODE = ROOT / "examples" / "nodes" / "mixed.toml"
GiB = 2**30


@pytest.fixture
def mixed_inventory() -> Inventory:
    return discover_all("sim", [SimulatedBackend(MIXED_NODE)])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(str(tmp_path / "state"))
    ledger.open()
    yield ledger
    ledger.close()


def gpu(
    index: int,
    *,
    vram_gib: int = 80,
    model: str = "A100-SXM4-80GB",
    vendor: Vendor = Vendor.NVIDIA,
    tflops: float = 312.0,
    links: tuple[tuple[int, LinkKind, float], ...] = (),
    health: HealthState = HealthState.HEALTHY,
    score: int = 100,
) -> Device:
    """A device named `dev-<index>` with links given as (peer index, kind, GB/s)."""
    return Device(
        uuid=f"dev-{index}",
        vendor=vendor,
        model=model,
        index=index,
        pci_bus_id=f"0000:{index:02x}:00.0",
        vram_bytes=vram_gib * GiB,
        tflops_fp16=tflops,
        links=tuple(Link(f"dev-{peer}", kind, gbps) for peer, kind, gbps in links),
        health_state=health,
        health_score=score,
    )
