"""What the kubelet plugin sends hcsd for a claim's allocation (hcsd/cluster/kubeletplugin)."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.cluster.kubeletplugin.claims import ClaimError, base_request, prepare_request
from hcsd.cluster.kubeletplugin.plugin import PluginPaths


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(
            {"request": "gpu", "driver": "compute.hcs.io", "pool": "n1", "device": "nvidia-0",
             "shareID": "s-1", "consumedCapacity": {"memory": "16Gi", "compute": "30"}},
            ("gpu", "nvidia-0", "n1", "s-1", "16Gi", "30"),
            id="a-share",
        ),
        pytest.param(
            {"request": "gpu/a100", "driver": "compute.hcs.io", "pool": "n1",
             "device": "ascend-1"},
            ("gpu/a100", "ascend-1", "n1", "", "", ""),
            id="whole-device-from-a-subrequest",
        ),
    ],
)  # fmt: skip
def test_results_of_this_driver_become_claim_devices(
    result: dict[str, Any], expected: tuple[str, ...]
) -> None:
    other = {"request": "nic", "driver": "rdma.example.com", "pool": "n1", "device": "mlx5-0"}
    request = prepare_request(claim(other, result))
    (device,) = request.devices
    got = (device.request, device.device, device.pool, device.share_id, device.memory)
    assert (*got, device.compute) == expected
    assert (request.claim.namespace, request.claim.name, request.claim.uid) == ("ns", "c", "u-1")


def test_a_claim_without_our_devices_is_an_error() -> None:
    other = {"request": "nic", "driver": "rdma.example.com", "pool": "n1", "device": "mlx5-0"}
    with pytest.raises(ClaimError, match=r"has no device of compute\.hcs\.io"):
        prepare_request(claim(other))


def test_base_request() -> None:
    assert base_request("gpu/a100") == "gpu"
    assert base_request("gpu") == "gpu"


@pytest.mark.parametrize(
    ("uid", "registration", "endpoint"),
    [
        pytest.param("", "compute.hcs.io-reg.sock", "dra.sock", id="fixed"),
        pytest.param("p-1", "compute.hcs.io-p-1-reg.sock", "dra-p-1.sock", id="rolling-update"),
    ],
)
def test_socket_names(uid: str, registration: str, endpoint: str) -> None:
    paths = PluginPaths.of("/var/lib/kubelet", uid)
    assert paths.registration == f"/var/lib/kubelet/plugins_registry/{registration}"
    assert paths.endpoint == f"/var/lib/kubelet/plugins/compute.hcs.io/{endpoint}"
