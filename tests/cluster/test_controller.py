"""hcs-controller on a real kube-apiserver, as its service account (the shipped RBAC).

Simulated nodes: a Node and its ComputeNode written as the node's syncer would (device health
in the status); pods bound through a Binding carrying an `hcs.io/assignment`, as the
extender binds them. No kubelet and no kube-controller-manager: an evicted pod stays
terminating (nothing confirms its end), and a PodDisruptionBudget's status is written here as
the disruption controller would. The timings are small (a round every 0.2 s, a quiet period
under a second) so that the whole loop runs in seconds.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hcsd.cluster.healer import Healer, Timing
from hcsd.cluster.healer_fleet import FleetPolicy
from hcsd.cluster.healer_limits import Limits
from hcsd.cluster.healer_policy import Policy, faults
from hcsd.cluster.kube import KubeError
from hcsd.cluster.leader import LeaderElector
from hcsd.contract import assignment
from hcsd.contract.names import CONTROLLER_LEASE, TAINT_UNHEALTHY
from hcsd.model import Grant
from hcsd.profiles.database import default_database
from tests.cluster.controlplane import ControlPlane, free_port, register_node

pytestmark = pytest.mark.slow

GiB = 2**30
CN = "/apis/hcs.io/v1alpha1/computenodes"
FAST = Timing(interval=0.2, backoff=0.3, backoff_max=1.0)
# the brakes off (each has its own test): a test's one or two nodes are the whole fleet
LOOSE = Limits(evictions_per_minute=600, breaker_share=1.0, min_bad_seconds=0)
FOREIGN_TAINT = {"key": "example.com/maintenance", "effect": "PreferNoSchedule"}


def wait(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Sim:
    """Nodes and pods of one test, removed after it."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.admin = plane.kube()
        self.tag = uuid.uuid4().hex[:6]
        self.nodes: list[str] = []
        self.pods: list[tuple[str, str]] = []

    def node(
        self, devices: int, *, model: str = "A100-SXM4-80GB", tflops: list[float] | None = None
    ) -> tuple[str, list[str]]:
        name = f"n{len(self.nodes)}-{self.tag}"
        register_node(self.admin, name)
        self.admin.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"spec": {"taints": [FOREIGN_TAINT]}},
            content_type="application/strategic-merge-patch+json",
        )
        uuids = [f"GPU-{self.tag}-{len(self.nodes)}-{i}" for i in range(devices)]
        spec = {
            "nodeName": name,
            "devices": [
                {"uuid": u, "vendor": "nvidia", "model": model, "index": i, "vramBytes": 80 * GiB,
                 "tflopsFP16": (tflops or [312.0] * devices)[i],
                 "fingerprint": "measured" if tflops else "profile",
                 # the node's measurement, as the syncer writes it (the profile's ratio is
                 # left for the controller to work out)
                 **({"measured": {"tflopsFP16": tflops[i]}} if tflops else {})}
                for i, u in enumerate(uuids)
            ],
        }  # fmt: skip
        self.admin.create(CN, {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeNode",
                               "metadata": {"name": name}, "spec": spec})  # fmt: skip
        self.nodes.append(name)
        self.health(name, {u: "healthy" for u in uuids})
        return name, uuids

    def health(self, node: str, states: dict[str, str]) -> None:
        """The device states, as the node's syncer writes them (other status fields kept)."""
        current = self.admin.get(f"{CN}/{node}")
        status = current.get("status") or {}
        status["devices"] = [
            {"uuid": u, "health": s, "healthScore": 100 if s == "healthy" else 0,
             **({"reason": "xid 79: fell off the bus"} if s != "healthy" else {})}
            for u, s in states.items()
        ]  # fmt: skip
        status["phase"] = "Ready"
        self.admin.replace(f"{CN}/{node}/status", {**current, "status": status})

    def pod(
        self, node: str, devices: list[str], *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """A pod bound to `node` holding `devices`, as the extender binds it."""
        name = f"p{len(self.pods)}-{self.tag}"
        created = self.admin.create("/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"schedulerName": "hcs-test-manual",
                     "containers": [{"name": "main", "image": "busybox"}]},
        })  # fmt: skip
        uid = created["metadata"]["uid"]
        grants = [Grant(d, 8 * GiB, 0) for d in devices]
        text = assignment.encode(
            assignment.Assignment(node, uid, time.time(), {"main": tuple(grants)}, "k1"),
            b"k" * 32,
        )
        self.admin.create(f"/api/v1/namespaces/default/pods/{name}/binding", {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "annotations": {assignment.ANNOTATION: text}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        })  # fmt: skip
        self.pods.append(("default", name))
        # Running and ready, as its kubelet would report it (the Eviction API deletes a
        # Pending pod without asking its PodDisruptionBudget)
        bound = self.admin.get(f"/api/v1/namespaces/default/pods/{name}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        bound["status"] = {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}  # fmt: skip
        return self.admin.replace(f"/api/v1/namespaces/default/pods/{name}/status", bound)

    def get_pod(self, name: str) -> dict[str, Any] | None:
        try:
            return self.admin.get(f"/api/v1/namespaces/default/pods/{name}")
        except KubeError as e:
            if e.not_found:
                return None
            raise

    def events(self, name: str, namespace: str = "default") -> list[tuple[str, str]]:
        items = self.admin.get(
            f"/api/v1/namespaces/{namespace}/events",
            [("fieldSelector", f"involvedObject.name={name}")],
        ).get("items", [])
        return [(e["reason"], e["message"]) for e in items]

    def node_events(self, node: str) -> list[tuple[str, str, str]]:
        """The Events on the ComputeNode (not the Node of that name): reason, message, type."""
        items = self.admin.get(
            "/api/v1/namespaces/default/events",
            [("fieldSelector", f"involvedObject.name={node},involvedObject.kind=ComputeNode")],
        ).get("items", [])
        for e in items:
            assert e["involvedObject"]["apiVersion"] == "hcs.io/v1alpha1", e
            assert e["source"]["component"] == "hcs-controller", e
        return [(e["reason"], e["message"], e["type"]) for e in items]

    def taints(self, node: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.admin.get(f"/api/v1/nodes/{node}")["spec"].get(
            "taints", []
        )
        return [{k: t[k] for k in ("key", "effect")} for t in found]

    def close(self) -> None:
        for namespace, name in self.pods:
            with contextlib.suppress(KubeError):
                self.admin.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                                   body={"gracePeriodSeconds": 0})  # fmt: skip
        for name in self.nodes:
            for path in (f"{CN}/{name}", f"/api/v1/nodes/{name}"):
                with contextlib.suppress(KubeError):
                    self.admin.request("DELETE", path)
        self.admin.close()


@pytest.fixture
def sim(plane: ControlPlane) -> Iterator[Sim]:
    s = Sim(plane)
    try:
        yield s
    finally:
        s.close()


def controller(
    plane: ControlPlane,
    policy: Policy | None = None,
    *,
    is_leader: Callable[[], bool] = lambda: True,
    fleet: FleetPolicy | None = None,
    limits: Limits = LOOSE,
) -> Healer:
    healer = Healer(
        plane.kube("controller"),
        default_database(),
        policy=policy or Policy(quiet_seconds=0.8),
        fleet=fleet,
        timing=FAST,
        limits=limits,
        is_leader=is_leader,
    ).start()
    wait("the controller's caches", healer.synced)
    return healer


def condition(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for c in ((pod or {}).get("status") or {}).get("conditions") or ():
        if c["type"] == "DisruptionTarget":
            return dict(c)
    return None


def count(healer: Healer, name: str, **labels: str) -> float:
    value = healer.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_a_failed_device_gets_its_pods_condition_and_eviction_once(
    plane: ControlPlane, sim: Sim
) -> None:
    node, (bad, good) = sim.node(2)
    hit = sim.pod(node, [bad])
    spared = sim.pod(node, [good])
    kept = sim.pod(node, [bad], annotations={"hcs.io/eviction": "never"})
    healer = controller(plane)
    try:
        time.sleep(0.6)  # rounds over a healthy node: nothing happens
        assert condition(sim.get_pod(hit["metadata"]["name"])) is None
        sim.health(node, {bad: "unhealthy", good: "healthy"})
        name = hit["metadata"]["name"]
        evicted = wait("the eviction", lambda: (sim.get_pod(name) or {}).get("metadata", {})
                       .get("deletionTimestamp") and sim.get_pod(name))  # fmt: skip
        assert (condition(evicted) or {}).get("status") == "True"
        # the Eviction API sets its own reason (EvictionByEvictionAPI); ours comes back
        found = wait("our reason", lambda: (condition(sim.get_pod(name)) or {}).get("reason")
                     == "HCSDeviceFailed" and condition(sim.get_pod(name)))  # fmt: skip
        assert f"device {bad} on node {node} is unhealthy" in found["message"]
        # the Evicted event is posted after the reason is restored
        wait("the Evicted event", lambda: "Evicted" in [r for r, _ in sim.events(name)])
        assert "HCSDeviceFailed" in [r for r, _ in sim.events(name)]
        (message,) = [m for r, m in sim.events(name) if r == "HCSDeviceFailed"]
        assert f"device {bad} on node {node} is unhealthy: xid 79" in message
        wait("the ComputeNode's event", lambda: any(
            r == "PodEvicted" and name in m for r, m, _ in sim.node_events(node)))  # fmt: skip
        # the opted-out pod: not evicted, no condition, said once
        kept_name = kept["metadata"]["name"]
        wait(
            "the opt-out event", lambda: "EvictionSkipped" in [r for r, _ in sim.events(kept_name)]
        )
        time.sleep(0.6)
        kept_now = sim.get_pod(kept_name)
        assert kept_now is not None and not kept_now["metadata"].get("deletionTimestamp")
        assert condition(kept_now) is None
        assert [r for r, _ in sim.events(kept_name)].count("EvictionSkipped") == 1
        skipped = [m for r, m, _ in sim.node_events(node) if r == "PodEvictionSkipped"]
        assert len(skipped) == 1 and f"default/{kept_name} opted out" in skipped[0]
        # the pod on the healthy device is untouched; one eviction in all, rounds later too
        spared_now = sim.get_pod(spared["metadata"]["name"])
        assert spared_now is not None and not spared_now["metadata"].get("deletionTimestamp")
        assert count(healer, "hcs_controller_evictions_total", result="evicted",
                     reason="HCSDeviceFailed") == 1  # fmt: skip
        assert count(healer, "hcs_controller_evictions_total", result="opted_out",
                     reason="HCSDeviceFailed") == 1  # fmt: skip
        assert [r for r, _ in sim.events(name)].count("Evicted") == 1
        # the owner takes the opt-out back: the pod is evicted then
        sim.admin.patch(f"/api/v1/namespaces/default/pods/{kept_name}",
                        {"metadata": {"annotations": {"hcs.io/eviction": None}}})  # fmt: skip
        wait("the eviction after the opt-out", lambda: (sim.get_pod(kept_name) or {})
             .get("metadata", {}).get("deletionTimestamp"))  # fmt: skip
    finally:
        healer.stop()


def test_a_node_cannot_get_another_nodes_pods_evicted(plane: ControlPlane, sim: Sim) -> None:
    """Root on a node writes its ComputeNode's status: allocations naming pods bound to
    another node, on a device it reports failed. Neither pod is touched; its own is."""
    node, (bad,) = sim.node(1)
    other, (theirs,) = sim.node(1)
    held = sim.pod(other, [theirs])  # the informer knows it bound to `other`
    # no assignment: only a read of this pod shows where it is bound
    bare = sim.admin.create("/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"bare-{sim.tag}"},
        "spec": {"nodeName": other, "containers": [{"name": "main", "image": "busybox"}]},
    })  # fmt: skip
    sim.pods.append(("default", bare["metadata"]["name"]))
    own = sim.pod(node, [bad])
    sim.health(node, {bad: "unhealthy"})
    current = sim.admin.get(f"{CN}/{node}")
    current["status"]["allocations"] = [
        {"containerID": f"c-{p['metadata']['uid']}", "podUID": p["metadata"]["uid"],
         "namespace": "default", "pod": p["metadata"]["name"], "container": "main",
         "source": "assignment", "grants": [{"uuid": bad, "vramBytes": GiB, "compute": 0}]}
        for p in (held, bare)
    ]  # fmt: skip
    sim.admin.replace(f"{CN}/{node}/status", current)
    healer = controller(plane)
    try:
        name = own["metadata"]["name"]
        wait("the node's own pod evicted", lambda: (sim.get_pod(name) or {})
             .get("metadata", {}).get("deletionTimestamp"))  # fmt: skip
        time.sleep(0.8)  # rounds after it
        for victim in (held, bare):
            now = sim.get_pod(victim["metadata"]["name"])
            assert now is not None and not now["metadata"].get("deletionTimestamp")
            assert condition(now) is None
            assert sim.events(victim["metadata"]["name"]) == []
        assert count(healer, "hcs_controller_evictions_total", result="evicted",
                     reason="HCSDeviceFailed") == 1  # fmt: skip
    finally:
        healer.stop()


def test_a_pod_that_has_ended_is_not_evicted(plane: ControlPlane, sim: Sim) -> None:
    """A pod whose container exited as its device failed is Failed (or Succeeded) while
    hcsd's allocation may still name it in the ComputeNode's status (it is released at the
    container's stop, the syncer writes within a fraction of a second). It holds nothing:
    evicting it would only delete the record of its end (its status, its logs) and count an
    eviction that was not one. The running pod beside it is evicted."""
    node, (bad,) = sim.node(1)
    running = sim.pod(node, [bad])
    ended = sim.pod(node, [bad])
    name = ended["metadata"]["name"]
    current = sim.admin.get(f"/api/v1/namespaces/default/pods/{name}")
    current["status"] = {"phase": "Failed", "conditions": []}
    sim.admin.replace(f"/api/v1/namespaces/default/pods/{name}/status", current)
    sim.health(node, {bad: "unhealthy"})
    status = sim.admin.get(f"{CN}/{node}")
    status["status"]["allocations"] = [
        {"containerID": f"c-{name}", "podUID": ended["metadata"]["uid"], "namespace": "default",
         "pod": name, "container": "main", "source": "assignment",
         "grants": [{"uuid": bad, "vramBytes": GiB, "compute": 0}]},
    ]  # fmt: skip
    sim.admin.replace(f"{CN}/{node}/status", status)
    healer = controller(plane)
    try:
        other = running["metadata"]["name"]
        wait("the running pod evicted", lambda: (sim.get_pod(other) or {})
             .get("metadata", {}).get("deletionTimestamp"))  # fmt: skip
        time.sleep(0.8)  # rounds after it
        now = sim.get_pod(name)
        assert now is not None and not now["metadata"].get("deletionTimestamp")
        assert now["status"]["phase"] == "Failed" and condition(now) is None
        assert sim.events(name) == []
        assert count(healer, "hcs_controller_evictions_total", result="evicted",
                     reason="HCSDeviceFailed") == 1  # fmt: skip
    finally:
        healer.stop()


def test_the_brakes_dry_run_minimum_bad_time_and_breaker(plane: ControlPlane, sim: Sim) -> None:
    node, (a, b) = sim.node(2)
    other, (c, d) = sim.node(2)
    pod = sim.pod(node, [a])
    name = pod["metadata"]["name"]

    def untouched() -> bool:
        now = sim.get_pod(name)
        return now is not None and not now["metadata"].get("deletionTimestamp")

    # dry run: said and counted, nothing written
    healer = controller(plane, limits=Limits(breaker_share=1.0, min_bad_seconds=0, dry_run=True))
    try:
        sim.health(node, {a: "lost", b: "lost"})
        wait("the dry run", lambda: count(healer, "hcs_controller_evictions_total",
             result="dry_run", reason="HCSDeviceFailed") == 1)  # fmt: skip
        time.sleep(0.6)
        assert untouched() and condition(sim.get_pod(name)) is None
        assert sim.taints(node) == [FOREIGN_TAINT]
    finally:
        healer.stop()
    # the breaker: two nodes of two dead (over half): nothing evicted nor tainted, said
    sim.health(other, {c: "lost", d: "unhealthy"})
    healer = controller(plane, limits=Limits(min_bad_seconds=0))
    try:
        wait("the open breaker", lambda: healer.metrics.circuit_open._value.get() == 1)
        time.sleep(0.6)
        assert untouched() and sim.taints(node) == [FOREIGN_TAINT]
        sim.health(other, {c: "healthy", d: "healthy"})
        # one dead node of two (not over half): acting again
        wait("the closed breaker", lambda: healer.metrics.circuit_open._value.get() == 0)
        wait("the eviction", lambda: not untouched())
    finally:
        healer.stop()
    # the device must be bad 1.5 s (as this controller sees it) before its pod goes
    name = sim.pod(node, [b])["metadata"]["name"]
    healer = controller(plane, limits=Limits(min_bad_seconds=1.5))
    try:
        started = time.monotonic()
        wait("the eviction", lambda: not untouched())
        assert time.monotonic() - started >= 1.2
    finally:
        healer.stop()


def test_a_disruption_budget_holds_the_eviction_back_and_it_is_retried(
    plane: ControlPlane, sim: Sim
) -> None:
    node, (bad,) = sim.node(1)
    app = f"trainer-{sim.tag}"
    pod = sim.pod(node, [bad], labels={"app": app})
    name = pod["metadata"]["name"]
    pdb = sim.admin.create("/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    })  # fmt: skip
    healer = controller(plane)
    try:
        sim.health(node, {bad: "lost"})
        wait("the blocked eviction", lambda: count(healer, "hcs_controller_evictions_total",
             result="blocked", reason="HCSDeviceFailed") >= 3)  # fmt: skip
        held = sim.get_pod(name)
        assert held is not None and not held["metadata"].get("deletionTimestamp")
        # no condition while the budget refuses (the disruption controller would take it
        # off again); the Event says why, once
        assert condition(held) is None
        assert [r for r, _ in sim.events(name)].count("EvictionBlocked") == 1
        assert [r for r, _ in sim.events(name)].count("HCSDeviceFailed") == 1
        blocked = [m for r, m, _ in sim.node_events(node) if r == "PodEvictionBlocked"]
        assert len(blocked) == 1 and f"blocks evicting default/{name}" in blocked[0]
        assert healer.metrics.blocked._value.get() == 1
        # the disruption controller's word: one disruption allowed now
        current = sim.admin.get(f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{app}")
        current["status"] = {"observedGeneration": current["metadata"]["generation"],
                             "disruptionsAllowed": 1, "currentHealthy": 1, "desiredHealthy": 0,
                             "expectedPods": 1}  # fmt: skip
        sim.admin.replace(
            f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{app}/status", current
        )
        wait("the eviction once allowed", lambda: (sim.get_pod(name) or {}).get("metadata", {})
             .get("deletionTimestamp"))  # fmt: skip
        # counted when the Eviction call returns, a moment after the API server marked the pod
        wait("the eviction counted", lambda: count(healer, "hcs_controller_evictions_total",
             result="evicted", reason="HCSDeviceFailed") == 1)  # fmt: skip
    finally:
        healer.stop()
        sim.admin.request(
            "DELETE",
            f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{pdb['metadata']['name']}",
        )


def test_a_node_with_every_device_down_is_tainted_until_they_recover(
    plane: ControlPlane, sim: Sim
) -> None:
    node, (a, b) = sim.node(2)
    healer = controller(plane)
    ours = {"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}
    try:
        sim.health(node, {a: "unhealthy", b: "healthy"})
        time.sleep(0.8)
        assert sim.taints(node) == [FOREIGN_TAINT]  # one of two: below the share
        sim.health(node, {a: "unhealthy", b: "lost"})
        wait("the taint", lambda: ours in sim.taints(node))
        assert FOREIGN_TAINT in sim.taints(node)
        wait("the taint's event", lambda: ("NodeTainted", "Warning")
             in [(r, t) for r, _, t in sim.node_events(node)])  # fmt: skip
        sim.health(node, {a: "healthy", b: "healthy"})
        recovered = time.monotonic()
        wait("the untaint", lambda: ours not in sim.taints(node))
        assert time.monotonic() - recovered >= 0.6  # the quiet period (0.8 s) held it
        assert sim.taints(node) == [FOREIGN_TAINT]
        wait("the untaint's event (posted after the patch)", lambda: ("NodeUntainted", "Normal")
             in [(r, t) for r, _, t in sim.node_events(node)])  # fmt: skip
        assert count(healer, "hcs_controller_taints_total", action="taint") == 1
        assert count(healer, "hcs_controller_taints_total", action="untaint") == 1
    finally:
        healer.stop()


def test_a_taint_taken_off_by_hand_is_put_back_after_the_reread(
    plane: ControlPlane, sim: Sim
) -> None:
    node, (a,) = sim.node(1)
    healer = Healer(plane.kube("controller"), default_database(), policy=Policy(quiet_seconds=0.8),
                    timing=Timing(interval=0.2, backoff=0.3, backoff_max=1.0, taint_reread=1.0),
                    limits=LOOSE).start()  # fmt: skip
    ours = {"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}
    try:
        wait("the controller's caches", healer.synced)
        sim.health(node, {a: "lost"})
        wait("the taint", lambda: ours in sim.taints(node))
        sim.admin.request("PATCH", f"/api/v1/nodes/{node}",
                          body={"spec": {"taints": [FOREIGN_TAINT]}},
                          content_type="application/strategic-merge-patch+json")  # fmt: skip
        wait("the taint again", lambda: ours in sim.taints(node), timeout=5)
    finally:
        healer.stop()


def test_a_share_policy_taints_with_no_execute(plane: ControlPlane, sim: Sim) -> None:
    node, uuids = sim.node(4)
    healer = controller(plane, Policy(taint_share=0.5, taint_effect="NoExecute"))
    try:
        sim.health(node, dict(zip(uuids, ["unhealthy", "unhealthy", "healthy", "healthy"])))
        time.sleep(0.8)
        assert sim.taints(node) == [FOREIGN_TAINT]  # half is not more than half
        sim.health(node, dict(zip(uuids, ["unhealthy", "unhealthy", "lost", "healthy"])))
        wait(
            "the taint", lambda: {"key": TAINT_UNHEALTHY, "effect": "NoExecute"} in sim.taints(node)
        )
    finally:
        healer.stop()


def test_two_controllers_one_acts_and_the_standby_takes_over(plane: ControlPlane, sim: Sim) -> None:
    node, (first, second) = sim.node(2)
    p1, p2 = sim.pod(node, [first]), sim.pod(node, [second])
    electors = [
        LeaderElector(plane.kube("controller"), "hcs-system", CONTROLLER_LEASE, who,
                      duration=2, renew=0.3).start()
        for who in (f"a-{sim.tag}", f"b-{sim.tag}")
    ]  # fmt: skip
    wait("a leader", lambda: any(e.is_leader() for e in electors), timeout=10)
    healers = [controller(plane, is_leader=e.is_leader) for e in electors]
    try:
        sim.health(node, {first: "unhealthy", second: "healthy"})
        name = p1["metadata"]["name"]
        wait("the eviction", lambda: (sim.get_pod(name) or {}).get("metadata", {})
             .get("deletionTimestamp"))  # fmt: skip
        time.sleep(0.6)
        evictions = [count(h, "hcs_controller_evictions_total", result="evicted",
                           reason="HCSDeviceFailed") for h in healers]  # fmt: skip
        leader = next(i for i, e in enumerate(electors) if e.is_leader())
        assert evictions[leader] == 1 and evictions[1 - leader] == 0
        assert [r for r, _ in sim.events(name)].count("Evicted") == 1
        assert count(healers[1 - leader], "hcs_controller_leader") == 0
        electors[leader].stop()  # the leader dies without giving the Lease back
        healers[leader].stop()
        standby = 1 - leader
        wait("the standby leading", electors[standby].is_leader, timeout=10)
        sim.health(node, {first: "unhealthy", second: "lost"})
        name2 = p2["metadata"]["name"]
        wait("the standby's eviction", lambda: (sim.get_pod(name2) or {}).get("metadata", {})
             .get("deletionTimestamp"))  # fmt: skip
        evicted = {"result": "evicted", "reason": "HCSDeviceFailed"}
        wait(
            "the standby's eviction counted",
            lambda: count(healers[standby], "hcs_controller_evictions_total", **evicted) == 1,
        )
    finally:
        for e in electors:
            e.stop()
        for h in healers:
            h.stop()


def test_leadership_is_asked_before_each_pod_and_ends_the_round(
    plane: ControlPlane, sim: Sim
) -> None:
    """A replica whose Lease ends mid-round (the next leader may be acting already) evicts
    no further pod: leadership is asked before each pod, not only per node."""
    node, (first, second) = sim.node(2)
    pods = [sim.pod(node, [first])["metadata"]["name"], sim.pod(node, [second])["metadata"]["name"]]
    sim.health(node, {first: "unhealthy", second: "unhealthy"})
    evicted = "hcs_controller_evictions_total"

    def is_leader() -> bool:  # the Lease is lost right after the first eviction
        return count(healer, evicted, result="evicted", reason="HCSDeviceFailed") < 1

    healer = Healer(plane.kube("controller"), default_database(), policy=Policy(quiet_seconds=0.8),
                    timing=FAST, limits=LOOSE, is_leader=is_leader)  # fmt: skip
    healer.nodes.start()
    healer.pods.start()
    try:
        policy = healer.policy

        def ready() -> bool:
            with healer.nodes.lock:
                nodes = [n for n in healer.nodes.items.values() if n["metadata"]["name"] == node]
            with healer.pods.lock:
                held = [p for p in healer.pods.items.values() if p.node == node]
            return healer.synced() and bool(nodes) and len(faults(nodes[0], policy)) == 2 \
                and len(held) == 2  # fmt: skip

        wait("the caches to see both failed devices and both pods", ready)
        healer.reconcile()
        time.sleep(0.3)
        deleted = [n for n in pods if (sim.get_pod(n) or {}).get("metadata", {})
                   .get("deletionTimestamp") or sim.get_pod(n) is None]  # fmt: skip
        assert len(deleted) == 1, deleted
        assert count(healer, evicted, result="evicted", reason="HCSDeviceFailed") == 1
    finally:
        healer.stop()


def test_stop_waits_for_the_round_in_progress_within_its_bound(
    plane: ControlPlane, sim: Sim
) -> None:
    """hcs-controller gives its Lease back only after stop() says no round runs any more."""
    sim.node(1)
    block, inside, go = threading.Event(), threading.Event(), threading.Event()

    def is_leader() -> bool:
        if block.is_set():  # a round held up (an API call in flight)
            inside.set()
            go.wait(10)
        return True

    healer = controller(plane, is_leader=is_leader)
    try:
        block.set()
        wait("a round in progress", inside.is_set)
        started = time.monotonic()
        assert healer.stop(timeout=0.5) is False  # still running: the Lease must not go back
        assert 0.4 < time.monotonic() - started < 3
    finally:
        go.set()
    assert healer.stop(timeout=5) is True


def test_an_event_the_tables_refuse_is_counted_not_raised(plane: ControlPlane, sim: Sim) -> None:
    """One bad reason (a bug) costs its Event only, not every round after it."""
    node, (device,) = sim.node(1)
    pod = sim.get_pod(sim.pod(node, [device])["metadata"]["name"])
    assert pod is not None
    healer = Healer(plane.kube("controller"), default_database(), is_leader=lambda: True)
    healer._event(pod, "NoSuchReason", "a reason outside healer_actions' tables")
    assert count(healer, "hcs_controller_api_errors_total", action="event") == 1


def test_a_slow_device_is_marked_against_the_fleet_and_isolated_by_policy(
    plane: ControlPlane, sim: Sim
) -> None:
    fast, _ = sim.node(2, tflops=[305.0, 300.0])
    slow_node, (slow, _) = sim.node(2, tflops=[190.0, 310.0])
    pod = sim.pod(slow_node, [slow])
    healer = controller(plane, Policy(isolate_degraded=True, quiet_seconds=0.8),
                        fleet=FleetPolicy(margin=0.15, min_devices=3))  # fmt: skip
    try:
        fleet = wait(
            "status.fleet",
            lambda: (sim.admin.get(f"{CN}/{slow_node}").get("status") or {}).get("fleet"),
        )
        (entry,) = fleet["slowDevices"]
        assert entry["uuid"] == slow and entry["efficiency"] == round(190 / 312, 3)
        assert "fleet median of A100-SXM4-80GB is 97%" in entry["reason"]
        assert "fleet" not in (sim.admin.get(f"{CN}/{fast}").get("status") or {})
        # kubectl get computenodes: the Slow column
        table = sim.admin.request(
            "GET", f"{CN}/{slow_node}", accept="application/json;as=Table;v=v1;g=meta.k8s.io"
        )
        columns = [c["name"] for c in table["columnDefinitions"]]
        assert table["rows"][0]["cells"][columns.index("Slow")].startswith("1 slow: ")
        name = pod["metadata"]["name"]
        wait("the eviction", lambda: (sim.get_pod(name) or {}).get("metadata", {})
             .get("deletionTimestamp"))  # fmt: skip
        assert any(r == "HCSDeviceDegraded" for r, _ in sim.events(name))
        assert ("SlowDevices", "Warning") in [(r, t) for r, _, t in sim.node_events(slow_node)]
        assert count(healer, "hcs_controller_slow_devices") == 1
        assert count(healer, "hcs_controller_fleet_marks_total", action="mark") == 1
        # the card comes back to the fleet's median: unmarked, said, counted
        spec = sim.admin.get(f"{CN}/{slow_node}")["spec"]
        spec["devices"][0]["measured"]["tflopsFP16"] = 302.0
        sim.admin.patch(f"{CN}/{slow_node}", {"spec": spec})
        wait("status.fleet cleared", lambda: "fleet" not in
             (sim.admin.get(f"{CN}/{slow_node}").get("status") or {}))  # fmt: skip
        wait("the cleared event", lambda: ("SlowDevicesCleared", "Normal") in
             [(r, t) for r, _, t in sim.node_events(slow_node)])  # fmt: skip
        assert count(healer, "hcs_controller_fleet_marks_total", action="clear") == 1
        assert count(healer, "hcs_controller_slow_devices") == 0
    finally:
        healer.stop()


def test_the_command_leads_serves_its_probes_and_metrics_and_acts(
    plane: ControlPlane, sim: Sim
) -> None:
    """hcs-controller as the Deployment runs it (its own process, its account, the Lease)."""
    node, (bad,) = sim.node(1)
    pod = sim.pod(node, [bad])
    port = free_port()
    log = open(plane.work / f"controller-{sim.tag}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "hcsd.cluster.healer_cli",
         "--kubeconfig", str(plane.config_for("controller")), "--identity", f"cli-{sim.tag}",
         "--probe-listen", f"127.0.0.1:{port}", "--interval-seconds", "0.2",
         "--lease-seconds", "2", "--renew-seconds", "0.3", "--eviction-grace-seconds", "0",
         "--breaker-share", "1", "--min-bad-seconds", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                return answer.status, answer.read().decode()
        except OSError:
            return 0, ""

    try:
        wait("/readyz", lambda: get("/readyz")[0] == 200)
        assert get("/healthz") == (200, "ok\n")
        wait("leading", lambda: "hcs_controller_leader 1.0" in get("/metrics")[1], timeout=10)
        sim.health(node, {bad: "unhealthy"})
        name = pod["metadata"]["name"]
        wait("the eviction (grace 0: the pod is gone)", lambda: sim.get_pod(name) is None)
        # the counter goes up when the Eviction call returns, a moment after the pod is gone
        evicted = 'hcs_controller_evictions_total{reason="HCSDeviceFailed",result="evicted"} 1.0'
        wait("the eviction counted", lambda: evicted in get("/metrics")[1])
        # its one device is down; the gauge is set at the end of the round
        wait("the tainted gauge", lambda: "hcs_controller_tainted_nodes 1.0" in get("/metrics")[1])
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def test_the_command_gives_its_lease_back_on_sigterm(plane: ControlPlane, sim: Sim) -> None:
    """A rolling update: the old replica's SIGTERM frees the Lease, so the new one leads at
    once instead of after --lease-seconds (a minute here)."""
    lease = f"/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/{CONTROLLER_LEASE}"
    port = free_port()
    log = open(plane.work / f"controller-term-{sim.tag}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "hcsd.cluster.healer_cli",
         "--kubeconfig", str(plane.config_for("controller")), "--identity", f"old-{sim.tag}",
         "--probe-listen", f"127.0.0.1:{port}", "--lease-seconds", "60",
         "--renew-seconds", "0.3"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait("the old replica leading", lambda: sim.admin.get(lease)["spec"].get("holderIdentity")
             == f"old-{sim.tag}", timeout=15)  # fmt: skip
        process.terminate()  # SIGTERM, to the process this test started
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    spec = sim.admin.get(lease)["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    new = LeaderElector(plane.kube("controller"), "hcs-system", CONTROLLER_LEASE,
                        f"new-{sim.tag}", duration=60)  # fmt: skip
    assert new.try_acquire() and new.is_leader()
    assert new.release()  # and the next test's replicas need not wait a minute either
