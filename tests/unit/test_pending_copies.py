"""What the extender's watch keeps of unbound pods for bind: a copy of bounded size, only of
pods it may be asked to bind, and at most so many of them (past that, bind GETs)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hcsd.cluster.binding import BindRequest
from hcsd.cluster.demand import demand_of
from hcsd.cluster.extender import Extender
from hcsd.cluster.fabric_jobs import job_of
from hcsd.cluster.holds import pod_info
from hcsd.cluster.pending import pending_copy
from hcsd.contract.names import JOB_SOURCES
from tests.unit.test_bind_pod_source import unbound
from tests.unit.test_extender_state import KEYS, new_extender

SERVED = frozenset({"hcs-scheduler"})


def bulky() -> dict[str, Any]:
    """A pending pod carrying what bind never reads, as much of it as the API server allows."""
    pod = unbound({"ai.compute/vram": "8Gi", "cpu": "2", "example.com/fpga": "1"})
    pod["metadata"]["annotations"] |= {
        "kubectl.kubernetes.io/last-applied-configuration": "x" * 250_000,
        "hcs.io/job": "train",  # an hcs.io/ annotation demand does not read
    }
    pod["metadata"]["labels"] |= {f"l{i}": "v" * 60 for i in range(100)}
    pod["spec"]["containers"] += [{"name": f"plain-{i}", "resources": {"limits": {"cpu": "1"}}}
                                  for i in range(50)]  # fmt: skip
    return pod


def test_the_copy_is_small_whatever_else_the_pod_carries() -> None:
    pod = bulky()
    copy = pending_copy(pod)
    assert copy is not None and demand_of(copy) == demand_of(pod)
    assert copy["metadata"] == {
        "uid": "u1", "name": "p", "namespace": "ns", "resourceVersion": "7",
        "annotations": {"hcs.io/models": "A100", "hcs.io/allow-substitution": "true",
                        "hcs.io/job": "train"},
        "labels": {"hcs.io/job": "train"},
    }  # fmt: skip
    assert [c["name"] for c in copy["spec"]["containers"]] == ["main", "side"]
    assert copy["spec"]["containers"][0]["resources"] == {
        "limits": {"ai.compute/vram": "8Gi"}, "requests": {}
    }  # fmt: skip
    assert len(json.dumps(copy)) < 600


def test_a_hint_too_long_to_be_one_gets_no_copy() -> None:
    pod = unbound({"ai.compute/devices": "1"})
    pod["metadata"]["annotations"]["hcs.io/models"] = "A100," * 2000
    assert pending_copy(pod) is None
    info = pod_info(pod, KEYS, schedulers=SERVED)
    assert info is not None and info.node == "" and info.pending is None  # bind GETs it


def test_pods_of_other_schedulers_and_gated_pods_are_not_kept() -> None:
    assert pod_info(unbound({"ai.compute/devices": "1"}), KEYS) is None  # hcs-scheduler's
    gated = unbound({"ai.compute/devices": "1"})
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert pod_info(gated, KEYS, schedulers=SERVED) is None
    kept = pod_info(unbound({"ai.compute/devices": "1"}), KEYS, schedulers=SERVED)
    assert kept is not None and kept.pending is not None


def served(limit: int) -> Extender:
    e = new_extender()
    e.state.copies.limit = limit
    return e


def watched(e: Extender, obj: dict[str, Any] | None, key: str) -> None:
    """One watch event through the pods informer's own transform (None: DELETED)."""
    e.state.pods.apply(key, None if obj is None else e.state.pods.transform(obj))


def named(name: str, uid: str) -> dict[str, Any]:
    pod = unbound({"ai.compute/devices": "1"}, uid=uid)
    pod["metadata"]["name"] = name
    pod["spec"]["schedulerName"] = "default-scheduler"
    return pod


def copies(e: Extender) -> float | None:
    return e.metrics.value("hcs_extender_pending_pod_copies")


def test_copies_are_capped_and_past_the_cap_bind_reads_the_pod_with_a_get() -> None:
    e = served(2)
    for i in range(3):
        watched(e, named(f"p{i}", f"u{i}"), f"ns/p{i}")
    assert copies(e) == 2
    third = e.state.pods.get("ns/p2")
    assert third is not None and third.node == "" and third.pending is None
    assert e.binder._watched(BindRequest("ns", "p2", "u2", "n")) is None  # a GET, then
    assert e.binder._watched(BindRequest("ns", "p0", "u0", "n")) is not None
    watched(e, named("p0", "u0"), "ns/p0")  # an update keeps its place
    assert copies(e) == 2
    watched(e, None, "ns/p0")  # deleted: its place goes to the next pod seen
    assert copies(e) == 1
    watched(e, named("p2", "u2"), "ns/p2")
    assert copies(e) == 2 and e.binder._watched(BindRequest("ns", "p2", "u2", "n")) is not None


def test_a_full_list_does_not_overshoot_the_cap() -> None:
    """A relist transforms every pod before applying any: admission reserves at once."""
    e = served(2)
    fresh = {f"ns/p{i}": e.state.pods.transform(named(f"p{i}", f"u{i}")) for i in range(5)}
    for key, info in fresh.items():
        e.state.pods.apply(key, info)
    assert copies(e) == 2
    assert sum(1 for i in e.state.pods.items.values() if i.pending is not None) == 2


def test_a_pod_bound_drops_its_copy() -> None:
    e = served(10)
    watched(e, named("p", "u1"), "ns/p")
    assert copies(e) == 1
    bound = named("p", "u1")
    bound["spec"]["nodeName"] = "n"  # bound without an assignment: holds nothing, not kept
    watched(e, bound, "ns/p")
    assert copies(e) == 0 and e.state.pods.get("ns/p") is None


@pytest.mark.parametrize(
    ("where", "key"),
    [("annotations", "hcs.io/job"), ("labels", "hcs.io/job"),
     *((("annotations" if w == "annotation" else "labels"), k) for w, k, _ in JOB_SOURCES)],
)  # fmt: skip
def test_the_copy_names_the_job_the_pod_names(where: str, key: str) -> None:
    """Bind records where a job's pod went (fabric placement) from the pod it read."""
    pod = bulky()
    pod["metadata"]["annotations"].pop("hcs.io/job")
    pod["metadata"]["labels"] = {}
    pod["metadata"][where][key] = "train-1"
    copy = pending_copy(pod)
    assert copy is not None and job_of(pod) is not None
    assert job_of(copy) == job_of(pod)
