"""What the kubelet plugin sends hcsd for a claim's allocation (hcsd/cluster/kubeletplugin)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import KubeError
from hcsd.cluster.kubeletplugin.claims import ClaimError, base_request, prepare_request
from hcsd.cluster.kubeletplugin.plugin import PluginPaths
from hcsd.cluster.kubeletplugin.profiles import add_runtime
from hcsd.profiles.database import default_database


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


class Profiles:
    """The API server's answers for RuntimeProfiles: the objects stored, else 404."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}

    def get(self, path: str) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if name not in self.objects:
            raise KubeError(404, "NotFound", path)
        return self.objects[name]


PYTORCH = {
    "metadata": {"name": "pytorch-2.5"},
    "spec": {"codeMount": "/workspace", "runtimes": [
        {"vendor": "nvidia", "models": ["H100"], "image": "ngc/pytorch:h100"},
        {"vendor": "nvidia", "image": "ngc/pytorch:any", "env": [{"name": "A", "value": "1"}]},
        {"vendor": "ascend", "image": "ascend/pytorch:1"},
    ]},
}  # fmt: skip
DEVICES = [
    pb.Device(vendor="nvidia", index=0, model="A100-SXM4-80GB"),
    pb.Device(vendor="nvidia", index=1, model="H100-SXM5-80GB"),
    pb.Device(vendor="cambricon", index=0, model="MLU370-X8"),
]


def profile_claim(*devices: str, profile: str = "pytorch-2.5", **status: Any) -> dict[str, Any]:
    found = claim(*({"request": "r0", "driver": "compute.hcs.io", "pool": "n1", "device": d}
                    for d in devices))  # fmt: skip
    found["metadata"]["annotations"] = {"hcs.io/runtime-profile": profile}
    found["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    found["status"].update(status)
    return found


RESOLVED = {
    "an A100: the any-model nvidia entry": (["nvidia-0"], "ngc/pytorch:any"),
    "an H100: the H100 entry before it": (["nvidia-1"], "ngc/pytorch:h100"),
    "both: the first entry admitting both": (["nvidia-0", "nvidia-1"], "ngc/pytorch:any"),
}


@pytest.mark.parametrize(("devices", "image"), RESOLVED.values(), ids=RESOLVED.keys())
def test_the_profile_entry_for_the_claims_devices_goes_with_prepare(
    devices: list[str], image: str
) -> None:
    found = profile_claim(*devices)
    request = prepare_request(found)
    add_runtime(request, found, Profiles(PYTORCH), DEVICES, default_database())
    assert json.loads(request.runtime)["image"] == image
    assert json.loads(request.runtime)["code_mount"] == "/workspace"
    assert request.pod_uid == "pod-1"


REFUSED = {
    "no entry for the device": (profile_claim("cambricon-0"), "has no image for cambricon"),
    "a device this node lacks": (profile_claim("nvidia-7"), "nvidia-7 are not on this node"),
    "a profile that does not exist": (profile_claim("nvidia-0", profile="gone"), "404"),
    "a name that is no name": (profile_claim("nvidia-0", profile="A B"), "is not a name"),
    "reserved for no pod": (profile_claim("nvidia-0", reservedFor=[]), "reserved for no pod"),
}


@pytest.mark.parametrize(("found", "words"), REFUSED.values(), ids=REFUSED.keys())
def test_a_profile_that_cannot_be_resolved_fails_the_prepare(
    found: dict[str, Any], words: str
) -> None:
    with pytest.raises(ClaimError, match=words):
        add_runtime(prepare_request(found), found, Profiles(PYTORCH), DEVICES, default_database())


def test_a_claim_naming_no_profile_sends_none() -> None:
    found = claim({"request": "r0", "driver": "compute.hcs.io", "pool": "n1", "device": "nvidia-0"})
    request = prepare_request(found)
    add_runtime(request, found, Profiles(), DEVICES, default_database())
    assert request.runtime == "" and request.pod_uid == ""
