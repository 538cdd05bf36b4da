"""hcs-controller's decisions (healer_policy, healer_fleet) over ComputeNodes as the syncer
builds them (tests/unit/fleet.py), and the extender's reading of a slow device."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.healer_fleet import FleetPolicy, efficiency, fleet_status, outliers
from hcsd.cluster.healer_policy import (
    PodRef,
    Policy,
    faults,
    holders,
    opted_out,
    pod_ref,
    should_taint,
)
from hcsd.cluster.objects import SLOW_SCORE, node_view
from hcsd.contract import assignment
from hcsd.model import Grant
from hcsd.profiles.database import default_database
from tests.unit.fleet import node_object

DB = default_database()


def with_states(obj: dict[str, Any], *states: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    for device, state in zip(obj["status"]["devices"], states, strict=True):
        device["health"] = state
        if state != "healthy":
            device["reason"] = "xid 79"
    return obj


def slow_mark(obj: dict[str, Any], uuid: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["status"]["fleet"] = {"slowDevices": [{"uuid": uuid, "reason": "61% of the median"}]}
    return obj


@pytest.mark.parametrize(
    ("states", "isolate_degraded", "expected"),
    [
        (("healthy", "healthy"), False, {}),
        (("unhealthy", "healthy"), False, {"n-0": "HCSDeviceFailed"}),
        (("lost", "unhealthy"), False, {"n-0": "HCSDeviceFailed", "n-1": "HCSDeviceFailed"}),
        (("degraded", "healthy"), False, {}),
        (("degraded", "healthy"), True, {"n-0": "HCSDeviceDegraded"}),
    ],
    ids=[
        "healthy",
        "one unhealthy",
        "lost and unhealthy",
        "degraded, default",
        "degraded, isolated",
    ],
)
def test_faults_follow_health_and_the_degraded_policy(
    states: tuple[str, ...], isolate_degraded: bool, expected: dict[str, str]
) -> None:
    node = with_states(node_object("n"), *states)
    found = faults(node, Policy(isolate_degraded=isolate_degraded))
    assert {u: f.reason for u, f in found.items()} == expected
    for fault in found.values():
        assert fault.message.startswith(f"device {fault.uuid} on node n is ")
        assert fault.message.endswith(": xid 79")


def test_a_sub_health_degraded_device_is_named_by_its_signals() -> None:
    node = with_states(node_object("n"), "degraded", "healthy")
    del node["status"]["devices"][0]["reason"]
    node["status"]["devices"][0]["subhealth"] = ["hw-slowdown", "pcie-link-x8-of-x16"]
    (fault,) = faults(node, Policy(isolate_degraded=True)).values()
    assert fault.message == "device n-0 on node n is degraded: hw-slowdown, pcie-link-x8-of-x16"


def test_a_slow_device_is_isolated_only_by_policy() -> None:
    node = slow_mark(node_object("n"), "n-1")
    assert faults(node, Policy()) == {}
    (fault,) = faults(node, Policy(isolate_degraded=True)).values()
    assert (fault.uuid, fault.state, fault.reason) == ("n-1", "slow", "HCSDeviceDegraded")


@pytest.mark.parametrize(
    ("devices", "bad", "share", "taint"),
    [
        (2, 0, 1.0, False),
        (2, 1, 1.0, False),
        (2, 2, 1.0, True),
        (4, 2, 0.5, False),  # half is not more than half
        (4, 3, 0.5, True),
        (0, 0, 0.5, False),  # no devices: not ours to judge
    ],
    ids=["none", "one of two", "all", "half, share 0.5", "three of four, share 0.5", "empty"],
)
def test_the_taint_needs_all_or_more_than_the_share(
    devices: int, bad: int, share: float, taint: bool
) -> None:
    node = node_object("n", count=devices) if devices else {"spec": {"devices": []}}
    assert should_taint(node, bad, Policy(taint_share=share)) is taint


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"taint_effect": "PreferNoSchedule"}, "taint effect"),
        ({"taint_share": 0.0}, "taint share"),
        ({"taint_share": 1.5}, "taint share"),
    ],
)
def test_a_bad_policy_is_refused(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Policy(**kwargs)


def pod(uid: str, node: str, uuids: list[str], **extra: Any) -> dict[str, Any]:
    grants = {"main": tuple(Grant(u, 1, 0) for u in uuids)}
    text = assignment.encode(assignment.Assignment(node, uid, time.time(), grants, "k1"), b"k" * 32)
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid,
                     "annotations": {assignment.ANNOTATION: text}, **extra.get("meta", {})},
        "spec": {"nodeName": extra.get("bound_to", node)},
        "status": {"phase": extra.get("phase", "Running")},
    }  # fmt: skip


def test_pod_ref_reads_the_devices_of_bound_running_pods_only() -> None:
    assert pod_ref(pod("u1", "n", ["n-0", "n-1"])) == PodRef(
        "u1", "ns", "pod-u1", "n", frozenset({"n-0", "n-1"})
    )
    assert pod_ref(pod("u1", "n", ["n-0"], phase="Succeeded")) is None
    assert (
        pod_ref(pod("u1", "n", ["n-0"], meta={"deletionTimestamp": "2026-01-01T00:00:00Z"})) is None
    )
    with pytest.raises(ValueError, match="is for node n, this is other"):
        pod_ref(pod("u1", "n", ["n-0"], bound_to="other"))  # copied onto another node's pod


def test_holders_come_from_assignments_and_hcsds_allocations() -> None:
    # u-alloc holds n-0 by hcsd's allocation (placed without an assignment)
    node = with_states(
        node_object("n", count=3, allocated={0: ("u-alloc", 8)}), "unhealthy", "healthy", "lost"
    )
    refs = [pod_ref(pod("u1", "n", ["n-0"])), pod_ref(pod("u2", "n", ["n-1"])),
            pod_ref(pod("u3", "n", ["n-1", "n-2"])), pod_ref(pod("u4", "m", ["n-0"]))]  # fmt: skip
    bad = faults(node, Policy())
    found = holders(node, [r for r in refs if r is not None], bad)
    assert [(t.uid, [f.uuid for f in t.faults]) for t in found] == [
        ("u-alloc", ["n-0"]),
        ("u1", ["n-0"]),
        ("u3", ["n-2"]),
    ]
    assert found[0].key == "ns/u-alloc"


@pytest.mark.parametrize(
    ("value", "out"), [("never", True), (" Never ", True), ("", False), ("always", False)]
)
def test_the_opt_out_annotation(value: str, out: bool) -> None:
    assert opted_out({"hcs.io/eviction": value}) is out


def measured(name: str, *tflops: float, model: str = "A100-SXM4-80GB") -> dict[str, Any]:
    obj = node_object(name, count=len(tflops))
    for device, figure in zip(obj["spec"]["devices"], tflops, strict=True):
        device.update(tflopsFP16=figure, fingerprint="measured", model=model)
    return obj


def test_efficiency_is_measured_over_the_profile_and_nothing_unmeasured() -> None:
    (device,) = measured("n", 156.0)["spec"]["devices"]
    assert efficiency(device, DB) == pytest.approx(0.5)
    # the node's own measurement: its ratio, else its figure over the profile's
    assert efficiency({**device, "measured": {"tflopsFP16": 156.0, "ratio": 0.48}}, DB) == 0.48
    own = {**device, "fingerprint": "profile", "tflopsFP16": 312.0}
    assert efficiency({**own, "measured": {"tflopsFP16": 234.0}}, DB) == pytest.approx(0.75)
    assert efficiency({**device, "fingerprint": "profile"}, DB) is None
    assert efficiency({**device, "model": "no such chip"}, DB) is None
    assert efficiency({**device, "vendor": "nobody"}, DB) is None


def test_outliers_are_below_their_models_median_by_more_than_the_margin() -> None:
    nodes = [measured("a", 310.0, 305.0), measured("b", 300.0, 260.0), measured("c", 190.0)]
    found = outliers(nodes, DB, FleetPolicy(margin=0.15, min_devices=3))
    # median of 310, 305, 300, 260, 190 over 312 is 300/312; 260 is within 15%, 190 is not
    assert [(o.node, o.uuid) for o in found] == [("c", "c-0")]
    assert found[0].median == pytest.approx(300 / 312)
    status = fleet_status(found, FleetPolicy(margin=0.15))
    assert status is not None
    assert status["summary"] == "1 slow: c-0 61%/96%"
    assert status["slowDevices"][0]["efficiency"] == round(190 / 312, 3)
    assert fleet_status([], FleetPolicy()) is None


def test_too_few_measured_devices_of_a_model_make_no_median() -> None:
    nodes = [measured("a", 310.0), measured("b", 100.0)]
    assert outliers(nodes, DB, FleetPolicy(min_devices=3)) == []
    # another model's devices do not count towards it
    nodes.append(measured("c", 300.0, model="H100-SXM5-80GB"))
    assert outliers(nodes, DB, FleetPolicy(min_devices=3)) == []


def test_the_extender_scores_a_slow_device_down() -> None:
    view = node_view(slow_mark(node_object("n", health=pb.HEALTH_STATE_HEALTHY), "n-1"))
    assert [d.health_score for d in view.devices] == [100, SLOW_SCORE]


def test_an_allocation_naming_a_pod_bound_elsewhere_is_ignored() -> None:
    # root on node n writes its own ComputeNode status: an allocation naming u4, a pod
    # bound to m, must not make n's failure evict it
    node = with_states(node_object("n", count=1, allocated={0: ("u4", 8)}), "unhealthy")
    refs = [pod_ref(pod("u4", "m", ["m-0"]))]
    found = holders(node, [r for r in refs if r is not None], faults(node, Policy()))
    assert found == []


def test_a_target_is_acted_on_only_when_the_pod_read_back_is_bound_to_its_node() -> None:
    # a pod the informer does not hold (no assignment) is checked when it is read back
    node = with_states(node_object("n", count=1, allocated={0: ("u9", 8)}), "unhealthy")
    (target,) = holders(node, [], faults(node, Policy()))
    assert target.node == "n"
    assert target.bound_here(pod("u9", "n", ["n-0"]))
    assert not target.bound_here(pod("u9", "m", ["m-0"]))  # bound to another node
    assert not target.bound_here(pod("other", "n", ["n-0"]))  # another pod of that name
    unbound = pod("u9", "n", ["n-0"])
    unbound["spec"] = {}
    assert not target.bound_here(unbound)
