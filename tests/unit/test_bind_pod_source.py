"""Where bind reads the pod it signs for: the extender's watch of pods keeps a slim copy of
each unbound pod asking for accelerators, with everything the demand is computed from; a
later event of that still-unbound pod must not undo what a bind in flight assumed."""

from __future__ import annotations

from typing import Any

import pytest

from hcsd.cluster.binding import BindRequest
from hcsd.cluster.demand import demand_of
from hcsd.cluster.holds import pending_copy, pod_info
from tests.unit.fleet import GiB, add_node, assigned, beat
from tests.unit.test_extender_state import KEYS, new_extender

SERVED = frozenset({"hcs-scheduler"})


def unbound(limits: dict[str, str], *, phase: str = "Pending", uid: str = "u1") -> dict[str, Any]:
    """A pod as the API server lists it before it is bound, with what demand does not read."""
    return {
        "metadata": {
            "name": "p", "namespace": "ns", "uid": uid, "resourceVersion": "7",
            "labels": {"hcs.io/job": "train"}, "managedFields": [{"manager": "kubectl"}],
            "annotations": {"hcs.io/models": "A100", "hcs.io/allow-substitution": "true"},
        },
        "spec": {
            "schedulerName": "hcs-scheduler", "nodeSelector": {"zone": "a"},
            "containers": [
                {"name": "main", "image": "busybox", "command": ["sleep", "1d"],
                 "resources": {"limits": limits, "requests": {"cpu": "1"}}},
                {"name": "side", "image": "busybox",
                 "resources": {"limits": {"ai.compute/vram": "4Gi"}}},
            ],
        },
        "status": {"phase": phase},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "kept"),
    [
        (unbound({"ai.compute/devices": "1"}), True),
        (unbound({"ai.compute/vram": "8Gi", "ai.compute/tflops-fp16": "100"}), True),
        (unbound({"cpu": "1"}) | {"spec": {"containers": [{"name": "c"}]}}, False),
        (unbound({"ai.compute/devices": "1"}, phase="Failed"), False),
    ],
    ids=["devices", "vram-tflops", "no-accelerator", "ended"],
)
def test_the_watch_keeps_unbound_pods_that_ask_for_accelerators(
    pod: dict[str, Any], kept: bool
) -> None:
    info = pod_info(pod, KEYS, schedulers=SERVED)
    assert (info is not None) == kept
    if info is not None:
        assert info.node == "" and info.holds == () and info.pending is not None
        assert info.pending["metadata"]["uid"] == "u1"
        assert info.pending["spec"]["schedulerName"] == "hcs-scheduler"


def test_the_copy_has_everything_the_demand_is_computed_from() -> None:
    pod = unbound({"ai.compute/vram": "8Gi", "ai.compute/devices": "2"})
    copy = pending_copy(pod)
    assert copy is not None and demand_of(copy) == demand_of(pod)
    assert "managedFields" not in copy["metadata"] and "command" not in str(copy)
    # The images of the containers that ask for devices: what a RuntimeProfile rebinds.
    assert [c["image"] for c in copy["spec"]["containers"]] == ["busybox", "busybox"]


def test_an_update_of_a_pod_being_bound_keeps_what_its_bind_assumed() -> None:
    e = new_extender()
    add_node(e, "n")
    beat(e, "n")
    e.state.pods.apply(
        "ns/p", pod_info(unbound({"ai.compute/vram": "60Gi"}), KEYS, schedulers=SERVED)
    )
    e.state.assume("u1", "n", assigned("u1", "n", (0, 60)).holds)  # its Binding not yet seen
    # Another write to the pod before the Binding (a label, a status condition): the watch
    # shows it unbound again, which says nothing about what it is about to hold.
    e.state.pods.apply(
        "ns/p", pod_info(unbound({"ai.compute/vram": "60Gi"}), KEYS, schedulers=SERVED)
    )
    assert e.state.snapshot().nodes["n"].usage["n-0"].vram_bytes == 60 * GiB
    assert e.binder._watched(BindRequest("ns", "p", "u1", "n")) is not None
    assert e.binder._watched(BindRequest("ns", "p", "u-other", "n")) is None  # GET instead
