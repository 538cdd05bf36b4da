"""Runtime profiles in DRA mode without a server: the claim narrowed to a profile's devices
(claim_shapes with a cover), the alternatives read back from a template (`selected`), the
choice from the slices' free capacity (profile_choice) and the patch that releases a gated
pod (profile_gate_controller.release_patch). The real API server and kube-scheduler are in
tests/cluster/test_dra_profiles.py.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from hcsd.cluster.claim_shapes import ShapeError, claim_spec, selected
from hcsd.cluster.demand import Demand, demand_of
from hcsd.cluster.profile_choice import Choice, choose, free_devices
from hcsd.cluster.profile_gate import gate_op, gated
from hcsd.cluster.profile_gate_controller import ProfileGate, _requests, release_patch
from hcsd.cluster.runtime_profiles import RuntimeProfile, cover_of, runtime_profile
from hcsd.profiles.database import default_database
from tests.cluster.test_dra_allocation import device, slice_for
from tests.unit.test_webhook_dra import apply

DB = default_database()

PROFILE = runtime_profile({
    "metadata": {"name": "pytorch-2.5"},
    "spec": {"runtimes": [
        {"vendor": "nvidia", "models": ["H100"], "image": "ngc/pytorch:h100"},
        {"vendor": "nvidia", "image": "ngc/pytorch:any"},
        {"vendor": "ascend", "image": "ascend/pytorch:1"},
    ]},
})  # fmt: skip
COVER = cover_of(PROFILE, DB)


def demand(
    limits: dict[str, str], profile: RuntimeProfile | None = PROFILE, **notes: str
) -> Demand:
    annotations = {f"hcs.io/{k}": v for k, v in notes.items()}
    pod = {
        "metadata": {"namespace": "team", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }  # fmt: skip
    found = demand_of(pod)
    assert found is not None
    return found if profile is None else replace(found, cover=cover_of(profile, DB))


def alternatives(spec: dict[str, Any]) -> list[Any]:
    (request,) = _requests({"spec": {"spec": spec}})
    return request


def test_a_vram_request_is_narrowed_to_the_profiles_vendors_in_its_order() -> None:
    found = alternatives(claim_spec(demand({"ai.compute/vram": "16Gi"}), DB))
    assert [(a.vendors, a.models) for a in found] == [
        (("ascend",), ()),
        (("nvidia",), ()),
        (("nvidia",), ("h100", "h100-sxm5-80gb")),
    ]
    assert {(a.count, a.memory, a.compute) for a in found} == {(1, 16 * 2**30, 0)}
    # the user's own narrowing still holds: nvidia only
    found = alternatives(claim_spec(demand({"ai.compute/vram": "16Gi"}, vendors="nvidia"), DB))
    assert {a.vendors for a in found} == {("nvidia",)}


def test_a_tflops_request_keeps_only_models_the_profile_has_an_image_for() -> None:
    found = alternatives(claim_spec(demand({"ai.compute/tflops-fp16": "100"}), DB))
    vendors = {v for a in found for v in a.vendors}
    assert vendors <= {"nvidia", "ascend"} and vendors == {"nvidia", "ascend"}
    without = alternatives(claim_spec(demand({"ai.compute/tflops-fp16": "100"}, None), DB))
    assert {v for a in without for v in a.vendors} - vendors  # others were offered before


def test_a_request_the_profile_cannot_serve_is_refused_with_its_images() -> None:
    with pytest.raises(ShapeError, match="has no image for the devices asked for"):
        claim_spec(demand({"ai.compute/vram": "16Gi"}, vendors="cambricon"), DB)


def test_selected_reads_back_what_the_webhook_wrote() -> None:
    spec = claim_spec(demand({"ai.compute/tflops-fp16": "100", "ai.compute/vram": "8Gi"},
                             None, models="A100,Ascend910B3"), DB)  # fmt: skip
    first = spec["devices"]["requests"][0]["firstAvailable"][0]
    read = selected(first)
    assert read.count == 1 and read.memory == 8 * 2**30 and read.compute in (32, 33)
    assert read.vendors in (("nvidia",), ("ascend",)) and read.models
    with pytest.raises(ValueError, match="not a vendor's class"):
        selected({"deviceClassName": "someone-else.example.com"})


A100 = [device("nvidia", i, "A100-SXM4-80GB", 80, "nvl-a") for i in (0, 1)]
NPU = [device("ascend", i, "Ascend910B3", 64, "hccs-b") for i in (0, 1)]
SLICES = [slice_for("gpu-a", A100), slice_for("npu-b", NPU)]


def claim(node: str, name: str, memory: str | None, compute: str = "0") -> dict[str, Any]:
    result: dict[str, Any] = {"driver": "compute.hcs.io", "pool": node, "device": name}
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory, "compute": compute}
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def test_free_capacity_counts_shares_and_whole_devices() -> None:
    free = {
        (d.node, d.name): d
        for d in free_devices(
            SLICES, [claim("gpu-a", "nvidia-0", "16Gi", "25"), claim("npu-b", "ascend-1", None)]
        )
    }
    assert free["gpu-a", "nvidia-0"].memory_free == 64 * 2**30
    assert free["gpu-a", "nvidia-0"].compute_free == 75
    assert free["npu-b", "ascend-1"].memory_free == 0
    assert free["gpu-a", "nvidia-1"].memory_free == 80 * 2**30


CHOICES = {
    "the first alternative (ascend) has room": ([], "npu-b", 2),
    "ascend full: nvidia, the profile's any-model entry": (
        [claim("npu-b", "ascend-0", None), claim("npu-b", "ascend-1", None)], "gpu-a", 1,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("claims", "node", "entry"), CHOICES.values(), ids=CHOICES.keys())
def test_the_choice_follows_the_alternatives_and_the_free_capacity(
    claims: list[dict[str, Any]], node: str, entry: int
) -> None:
    requests = [alternatives(claim_spec(demand({"ai.compute/vram": "16Gi"}), DB))]
    choice = choose(requests, COVER, free_devices(SLICES, claims))
    assert choice == Choice(entry, (node,))


def test_no_room_anywhere_keeps_the_pod_gated_with_the_reason() -> None:
    requests = [alternatives(claim_spec(demand({"ai.compute/vram": "16Gi"}), DB))]
    full = [claim(n, d["name"], None) for n, ds in (("gpu-a", A100), ("npu-b", NPU)) for d in ds]
    assert "no node has room now" in str(choose(requests, COVER, free_devices(SLICES, full)))
    assert "no node publishes" in str(choose(requests, COVER, []))
    tainted = copy.deepcopy(SLICES)
    for s in tainted:
        for d in s["spec"]["devices"]:
            d["taints"] = [{"key": "compute.hcs.io/unhealthy", "effect": "NoSchedule"}]
    assert isinstance(choose(requests, COVER, free_devices(tainted, [])), str)


def gated_pod(**spec: Any) -> dict[str, Any]:
    claims = [{"name": "hcs-accelerator", "request": "r0"}]
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "team", "uid": "u-7",
                     "annotations": {"hcs.io/runtime-profile": "pytorch-2.5"}},
        "spec": {"containers": [
            {"name": "main", "image": "code:1", "resources": {"claims": claims}},
            {"name": "sidecar", "image": "proxy:1"},
        ], **spec},
    }  # fmt: skip
    return apply(pod, [gate_op(pod["spec"])])


AFFINITY = {
    "no affinity": ({}, [[{"key": "metadata.name", "operator": "In", "values": ["npu-b"]}]]),
    "the user's terms keep theirs, each narrowed": (
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
        [[{"key": "metadata.name", "operator": "In", "values": ["npu-b"]}]],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("spec", "fields"), AFFINITY.values(), ids=AFFINITY.keys())
def test_the_release_sets_the_image_narrows_affinity_and_removes_only_its_gate(
    spec: dict[str, Any], fields: list[list[dict[str, Any]]]
) -> None:
    pod = gated_pod(**spec, schedulingGates=[{"name": "other.example.com/quota"}])
    assert gated(pod)
    patch = release_patch(pod, PROFILE, Choice(2, ("npu-b",)))
    tests = [op for op in patch if op["op"] == "test"]
    assert tests[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "u-7"},
        {"op": "test", "path": "/spec/schedulingGates", "value": pod["spec"]["schedulingGates"]},
    ]
    assert {"op": "test", "path": "/spec/containers/1/name", "value": "sidecar"} in tests
    released = apply(pod, [op for op in patch if op["op"] != "test"])
    assert not gated(released)
    assert released["spec"]["schedulingGates"] == [{"name": "other.example.com/quota"}]
    main, sidecar = released["spec"]["containers"]
    assert (main["image"], sidecar["image"]) == ("ascend/pytorch:1", "proxy:1")
    terms = released["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchFields"] for t in terms] == fields
    assert [t.get("matchExpressions") for t in terms] == [
        t.get("matchExpressions")
        for t in (spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [{}])
    ]


def test_capacities_that_cannot_be_read_are_counted_safely_not_raised() -> None:
    """A consumed capacity the gate cannot read takes the whole device; a slice device whose
    memory cannot be read is left out: neither stops the pass (it once ended the thread)."""
    broken = copy.deepcopy(SLICES)
    broken[0]["spec"]["devices"][1]["capacity"]["memory"]["value"] = "lots"
    free = {
        (d.node, d.name): d
        for d in free_devices(broken, [claim("npu-b", "ascend-0", "16Gi", "thirty")])
    }
    assert ("gpu-a", "nvidia-1") not in free and ("gpu-a", "nvidia-0") in free
    assert free["npu-b", "ascend-0"].memory_free == 0
    assert free["npu-b", "ascend-0"].compute_free == 0


class Failing:
    """An API whose every list raises what no KubeError handler catches."""

    def __init__(self) -> None:
        self.calls = 0

    def list_all(self, *_: Any, **__: Any) -> Any:
        self.calls += 1
        raise ValueError("a quantity the parser refuses")


def test_the_gate_keeps_running_after_a_pass_fails() -> None:
    api = Failing()
    gate = ProfileGate(api, DB)  # type: ignore[arg-type]
    stopping = threading.Event()
    thread = threading.Thread(target=gate.run, args=(stopping, 0.01, lambda: True))
    thread.start()
    deadline = time.monotonic() + 5
    while api.calls < 3:
        assert time.monotonic() < deadline, "the pass ran once and the thread ended"
        time.sleep(0.01)
    stopping.set()
    thread.join(5)
    assert not thread.is_alive()
