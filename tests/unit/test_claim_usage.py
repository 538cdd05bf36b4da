"""ComputeQuota in DRA mode (hcsd/cluster/claim_usage.py) without a server: which claims
count, and how much. tests/cluster/test_dra_slices.py counts claims kube-scheduler allocated."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.claim_usage import amounts_of_claim, claim_hold
from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.objects import NodeView, compute_node, node_spec, node_view
from hcsd.contract import dra

GiB = 2**30
OTHER = "gpu.example.com"  # another DRA driver


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "team"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, memory: str, compute: str | None = None, **extra: str) -> dict[str, Any]:
    consumed = {dra.CAPACITY_MEMORY: memory}
    if compute is not None:
        consumed[dra.CAPACITY_COMPUTE] = compute
    return {"request": "acc", "driver": dra.DRIVER, "pool": "n1", "device": device,
            "shareID": "s", "consumedCapacity": consumed, **extra}  # fmt: skip


def view() -> NodeView:
    devices = [
        pb.Device(uuid=f"u{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                  vram_bytes=80 * GiB, tflops_fp16=312.0)
        for i in range(2)
    ]  # fmt: skip
    return node_view(compute_node("n1", node_spec(pb.Node(name="n1"), devices)))


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (claim(result("nvidia-0", "16Gi", "25")), Amounts(16 * GiB, 78.0, 1)),
        (claim(result("nvidia-0", "16Gi")), Amounts(16 * GiB, 0.0, 1)),  # none reserved
        (
            claim(result("nvidia-0", "80Gi", "100"), result("nvidia-1", "8Gi", "0")),
            Amounts(88 * GiB, 312.0, 2),
        ),
        # a device no ComputeNode describes: its memory and count, no TFLOPS figure to use
        (claim(result("nvidia-7", "1Gi", "50")), Amounts(GiB, 0.0, 1)),
        # another driver's devices are not HCS's to count
        (claim(result("nvidia-0", "8Gi", "10"), {**result("x", "1Gi"), "driver": OTHER}),
         Amounts(8 * GiB, 31.2, 1)),
        # no consumedCapacity (DRAConsumableCapacity off, adminAccess): the whole device,
        # as hcsd grants it; 0 where no ComputeNode says how much that is
        (claim({k: v for k, v in result("nvidia-1", "0").items() if k != "consumedCapacity"}),
         Amounts(80 * GiB, 0.0, 1)),
        (claim({k: v for k, v in result("nvidia-7", "0").items() if k != "consumedCapacity"}),
         Amounts(0, 0.0, 1)),
    ],
    ids=["share", "memory only", "two devices", "unknown device", "other driver",
         "no consumed capacity", "no consumed capacity, unknown device"],
)  # fmt: skip
def test_a_claim_counts_what_its_devices_consumed(obj: dict[str, Any], want: Amounts) -> None:
    hold = claim_hold(obj)
    assert hold is not None and hold.namespace == "team"
    got = amounts_of_claim(hold, {"n1": view()}.get)
    assert (got.vram, round(got.tflops, 6), got.devices) == (want.vram, want.tflops, want.devices)


def test_claims_that_hold_nothing_of_hcs_are_not_counted() -> None:
    assert claim_hold({"metadata": {"namespace": "team"}, "status": {}}) is None
    assert claim_hold(claim({**result("x", "1Gi"), "driver": OTHER})) is None
    with pytest.raises(ValueError, match="consumedCapacity memory"):
        claim_hold(claim(result("nvidia-0", "lots")))
