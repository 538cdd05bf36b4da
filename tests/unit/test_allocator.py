from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hcsd.allocator import NoFit, Usage, choose
from hcsd.model import (
    Device,
    HealthState,
    LinkKind,
    Request,
    SpreadPolicy,
    TopologyPreference,
    Vendor,
)
from tests.conftest import GiB, gpu

NV = LinkKind.NVLINK
PCIE = LinkKind.PCIE_HOST


def ring_of_four() -> list[Device]:
    """0-1 and 2-3 are NVLink pairs; everything else crosses the host bridge."""
    return [
        gpu(0, links=((1, NV, 300), (2, PCIE, 16), (3, PCIE, 16))),
        gpu(1, links=((0, NV, 300), (2, PCIE, 16), (3, PCIE, 16))),
        gpu(2, links=((3, NV, 300), (0, PCIE, 16), (1, PCIE, 16))),
        gpu(3, links=((2, NV, 300), (0, PCIE, 16), (1, PCIE, 16))),
    ]


@dataclass
class Case:
    request: Request
    devices: list[Device]
    usage: dict[str, Usage] = field(default_factory=dict)
    policy: SpreadPolicy = SpreadPolicy.BINPACK
    expected: list[str] = field(default_factory=list)
    vram_each: int | None = None
    compute_each: int | None = None


CASES = {
    "binpack-fills-the-partly-used-device": Case(
        Request("c", vram_bytes=10 * GiB),
        [gpu(0), gpu(1)],
        usage={"dev-1": Usage(40 * GiB)},
        expected=["dev-1"],
    ),
    "spread-takes-the-least-used-device": Case(
        Request("c", vram_bytes=10 * GiB),
        [gpu(0), gpu(1)],
        usage={"dev-0": Usage(40 * GiB)},
        policy=SpreadPolicy.BINPACK,
        expected=["dev-0"],
    ),
    "spread-policy": Case(
        Request("c", vram_bytes=10 * GiB),
        [gpu(0), gpu(1)],
        usage={"dev-0": Usage(40 * GiB)},
        policy=SpreadPolicy.SPREAD,
        expected=["dev-1"],
    ),
    "request-policy-overrides-node-default": Case(
        Request("c", vram_bytes=10 * GiB, policy=SpreadPolicy.SPREAD),
        [gpu(0), gpu(1)],
        usage={"dev-0": Usage(40 * GiB)},
        expected=["dev-1"],
    ),
    "tightest-fit-wins-over-fuller-device-that-cannot-fit": Case(
        Request("c", vram_bytes=30 * GiB),
        [gpu(0), gpu(1), gpu(2)],
        usage={"dev-0": Usage(70 * GiB), "dev-1": Usage(45 * GiB)},
        expected=["dev-1"],
    ),
    "whole-device-when-no-vram-given": Case(
        Request("c"),
        [gpu(0), gpu(1)],
        usage={"dev-0": Usage(1 * GiB)},
        expected=["dev-1"],
        vram_each=80 * GiB,
        compute_each=100,
    ),
    "vendor-allow-list": Case(
        Request("c", vram_bytes=GiB, vendors=frozenset({Vendor.ASCEND})),
        [gpu(0), gpu(1, vendor=Vendor.ASCEND, model="Ascend910B3")],
        expected=["dev-1"],
    ),
    "model-allow-list-is-case-insensitive": Case(
        Request("c", vram_bytes=GiB, models=frozenset({"t4"})),
        [gpu(0), gpu(1, model="T4", vram_gib=16)],
        expected=["dev-1"],
    ),
    "unhealthy-skipped-degraded-used-last": Case(
        Request("c", vram_bytes=GiB),
        [
            gpu(0, health=HealthState.UNHEALTHY, score=0),
            gpu(1, health=HealthState.DEGRADED, score=60),
            gpu(2),
        ],
        expected=["dev-2"],
    ),
    "multi-device-takes-an-nvlink-pair-when-packing-ties": Case(
        Request("c", vram_bytes=10 * GiB, devices=2),
        ring_of_four(),
        expected=["dev-0", "dev-1"],
    ),
    "high-bandwidth-beats-packing": Case(
        Request("c", vram_bytes=10 * GiB, devices=2, topology=TopologyPreference.HIGH_BANDWIDTH),
        ring_of_four(),
        usage={"dev-1": Usage(60 * GiB), "dev-2": Usage(60 * GiB)},
        expected=["dev-0", "dev-1"],
    ),
    "packing-beats-links-without-preference": Case(
        Request("c", vram_bytes=10 * GiB, devices=2),
        ring_of_four(),
        usage={"dev-1": Usage(60 * GiB), "dev-2": Usage(60 * GiB)},
        expected=["dev-1", "dev-2"],
    ),
    "tflops-picks-fewest-devices-model": Case(
        Request("c", vram_bytes=GiB, tflops_fp16=300.0),
        [gpu(0, model="Z100", vendor=Vendor.HYGON, tflops=24.5), gpu(1)],
        expected=["dev-1"],
        compute_each=97,
    ),
    "tflops-spans-devices": Case(
        Request("c", vram_bytes=GiB, tflops_fp16=500.0),
        [gpu(0, links=((1, NV, 300),)), gpu(1, links=((0, NV, 300),)), gpu(2)],
        expected=["dev-0", "dev-1"],
        compute_each=0,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_choose(case: Case) -> None:
    placement = choose(case.request, case.devices, case.usage, default_policy=case.policy)
    assert sorted(g.device_uuid for g in placement.grants) == case.expected
    if case.vram_each is not None:
        assert {g.vram_bytes for g in placement.grants} == {case.vram_each}
    if case.compute_each is not None:
        assert {g.compute_percent for g in placement.grants} == {case.compute_each}


@pytest.mark.parametrize(
    ("request_", "devices", "usage", "reason", "message"),
    [
        pytest.param(
            Request("c", vram_bytes=GiB),
            [],
            {},
            "no_matching_device",
            "no accelerators",
            id="empty-node",
        ),
        pytest.param(
            Request("c", vendors=frozenset({Vendor.CAMBRICON})),
            [gpu(0)],
            {},
            "no_matching_device",
            "vendors cambricon",
            id="vendor",
        ),
        pytest.param(
            Request("c"),
            [gpu(0, health=HealthState.UNHEALTHY)],
            {},
            "unhealthy",
            "unhealthy",
            id="all-unhealthy",
        ),
        pytest.param(
            Request("c", vram_bytes=90 * GiB),
            [gpu(0)],
            {},
            "insufficient_vram",
            "90Gi wanted, most free is 80Gi",
            id="too-big",
        ),
        pytest.param(
            Request("c", vram_bytes=GiB, devices=3),
            [gpu(0), gpu(1)],
            {},
            "insufficient_devices",
            r"3 device\(s\)",
            id="too-many",
        ),
        pytest.param(
            Request("c", vram_bytes=GiB, compute_percent=50),
            [gpu(0)],
            {"dev-0": Usage(0, 60)},
            "insufficient_compute",
            "50% compute",
            id="compute",
        ),
        pytest.param(
            Request("c", vram_bytes=GiB, devices=2, topology=TopologyPreference.HIGH_BANDWIDTH),
            [gpu(0), gpu(1)],
            {},
            "no_linked_set",
            "peer-to-peer",
            id="no-links",
        ),
        pytest.param(
            Request("c", tflops_fp16=10.0),
            [gpu(0, tflops=0)],
            {},
            "unknown_tflops",
            "TFLOPS unknown",
            id="unknown-tflops",
        ),
    ],
)
def test_no_fit_reasons(
    request_: Request, devices: list[Device], usage: dict[str, Usage], reason: str, message: str
) -> None:
    with pytest.raises(NoFit, match=message) as info:
        choose(request_, devices, usage)
    assert info.value.reason == reason


def test_large_node_multi_device_choice_is_bounded() -> None:
    devices = [gpu(i) for i in range(32)]
    placement = choose(Request("c", vram_bytes=GiB, devices=8), devices, {})
    assert len(placement.grants) == 8
