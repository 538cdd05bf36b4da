"""The ResourceSlice a node's devices make (hcsd/cluster/dra_slices.py), without an API
server: islands, request policies, taints, and what counts as "the same slice".
tests/cluster/test_dra_slices.py checks that the API server and kube-scheduler read it so."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.dra_slices import link_domains, same_devices, slice_name, slice_spec
from hcsd.contract import dra

MiB, GiB = 2**20, 2**30


def dev(
    uuid: str, vendor: str = "nvidia", index: int = 0, vram: int = 80 * GiB, **fields: Any
) -> pb.Device:
    links = [pb.Link(peer_uuid=p, kind=k, gbps=100.0) for p, k in fields.pop("links", ())]
    return pb.Device(
        uuid=uuid, vendor=vendor, model="A100-SXM4-80GB", index=index, vram_bytes=vram,
        numa_node=fields.pop("numa", 0), links=links, **fields,
    )  # fmt: skip


def only(spec: dict[str, Any]) -> dict[str, Any]:
    (entry,) = spec["devices"]
    found: dict[str, Any] = entry
    return found


def test_islands_are_the_devices_joined_by_fabric_links_not_by_pcie() -> None:
    devices = [
        dev("a", index=0, links=[("b", "nvlink"), ("c", "pcie-switch")]),
        dev("b", index=1, links=[("a", "nvlink")]),
        dev("c", index=2, links=[("d", "nvlink")]),
        dev("d", index=3),  # its peer names the link: one end is enough
        dev("e", index=4, links=[("a", "system")]),
        dev("n0", "ascend", 0, links=[("n1", "hccs")]),
        dev("n1", "ascend", 1, links=[("n0", "hccs")]),
    ]
    assert link_domains(devices) == {
        "a": "nvidia-nvlink-0",
        "b": "nvidia-nvlink-0",
        "c": "nvidia-nvlink-2",
        "d": "nvidia-nvlink-2",
        "n0": "ascend-hccs-0",
        "n1": "ascend-hccs-0",
    }
    attributes = only(slice_spec("n", [dev("e")], generation=1))["attributes"]
    assert dra.ATTR_LINK_DOMAIN not in attributes  # no fabric: no island


STEPS = {"min": "268435456", "step": "268435456"}


@pytest.mark.parametrize(
    ("vram", "policy"),
    [
        (80 * GiB, {"default": str(80 * GiB), "validRange": STEPS}),
        # H100's 81559 MiB: the default (a whole-device claim) is all of it in whole steps
        (81559 * MiB, {"default": str(318 * 256 * MiB), "validRange": STEPS}),
        (384 * MiB, None),  # under two steps: not shared, a claim takes it all
    ],
    ids=["whole steps", "a remainder", "too small to share"],
)
def test_memory_is_consumed_in_steps_and_a_claim_without_capacity_takes_it_all(
    vram: int, policy: dict[str, Any] | None
) -> None:
    capacity = only(slice_spec("n", [dev("a", vram=vram)], generation=1))["capacity"]
    assert capacity[dra.CAPACITY_MEMORY]["value"] == str(vram)
    assert capacity[dra.CAPACITY_MEMORY].get("requestPolicy") == policy
    assert capacity[dra.CAPACITY_COMPUTE] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }


def test_attributes_leave_out_what_the_host_does_not_say_and_fit_the_api_limits() -> None:
    long_uuid = "GPU-" + "f" * 80
    device = dev(long_uuid, numa=-1, pci_bus_id="", tflops_fp16=312.0)
    device.attributes["measured_tflops_fp16"] = "287.25"
    attributes = only(slice_spec("n", [device], generation=1))["attributes"]
    assert dra.ATTR_NUMA not in attributes and dra.ATTR_PCI_BUS not in attributes
    assert attributes[dra.ATTR_UUID] == {"string": long_uuid[:64]}
    assert attributes[dra.ATTR_TFLOPS] == {"string": "287.25"}  # measured wins
    assert attributes[dra.ATTR_INDEX] == {"int": 0}


def test_a_refused_measured_figure_scores_at_the_profiles_not_at_the_rating_it_gave() -> None:
    """A broken timing (outside the CRD's bounds) rated the device on the node; the slice, like
    the ComputeNode (hcsd/cluster/measured.py), shows the profile's figure instead."""
    device = dev("GPU-broken", tflops_fp16=-4.7)
    device.attributes["fingerprint"] = "measured"
    device.attributes["measured_tflops_fp16"] = "-5.000"
    attributes = only(slice_spec("n", [device], generation=1))["attributes"]
    assert attributes[dra.ATTR_TFLOPS] == {"string": "312"}  # the A100's profile


def test_unschedulable_devices_are_tainted_and_keep_the_servers_time_stamp() -> None:
    devices = [
        dev("a", index=0, health_state=pb.HEALTH_STATE_UNHEALTHY),
        dev("b", index=1, health_state=pb.HEALTH_STATE_LOST),
        dev("c", index=2, health_state=pb.HEALTH_STATE_DEGRADED),  # still schedulable
    ]
    spec = slice_spec("n", devices, generation=1, taint_effect="NoExecute")
    assert [[t["value"] for t in d.get("taints", ())] for d in spec["devices"]] == [
        ["unhealthy"], ["lost"], []
    ]  # fmt: skip
    stored = slice_spec("n", devices, generation=1, taint_effect="NoExecute")
    stored["devices"][0]["taints"][0]["timeAdded"] = "2026-11-23T09:00:00Z"
    again = slice_spec("n", devices, generation=1, taint_effect="NoExecute", stored=stored)
    assert again["devices"][0]["taints"][0]["timeAdded"] == "2026-11-23T09:00:00Z"
    assert same_devices(stored, again)
    with pytest.raises(ValueError, match="PreferNoSchedule"):
        slice_spec("n", devices, generation=1, taint_effect="PreferNoSchedule")


def test_the_same_slice_is_the_same_whatever_the_servers_quantity_spelling_and_generation() -> None:
    body = slice_spec("n", [dev("a")], generation=4)
    stored = slice_spec("n", [dev("a")], generation=3)
    stored["devices"][0]["capacity"][dra.CAPACITY_MEMORY]["value"] = "80Gi"
    assert same_devices(stored, body)
    assert not same_devices(None, body)
    assert not same_devices(stored, slice_spec("n", [dev("a", vram=40 * GiB)], generation=4))
    assert not same_devices(stored, slice_spec("n", [dev("a"), dev("b", index=1)], generation=4))


def test_names_are_the_cdi_names_and_the_slice_is_named_after_its_node() -> None:
    devices = [dev("b", "ascend", 1), dev("a", "nvidia", 0), dev("c", "ascend", 0)]
    spec = slice_spec("node-1", devices, generation=1)
    assert [d["name"] for d in spec["devices"]] == ["ascend-0", "ascend-1", "nvidia-0"]
    assert spec["pool"] == {"name": "node-1", "generation": 1, "resourceSliceCount": 1}
    assert slice_name("node-1") == f"{dra.DRIVER}-node-1"
    assert all(d["allowMultipleAllocations"] is True for d in spec["devices"])
