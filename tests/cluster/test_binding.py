"""Bind and the ComputeQuota status writer against a real kube-apiserver: the extender runs
in-process with its real informers, as its own service account; pods stay Pending (no
kube-scheduler here), so each test decides what is filtered and bound, and when."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.cluster.binding import BindRequest
from hcsd.cluster.extender import Extender
from hcsd.cluster.kube import lease_object
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.assignment import ANNOTATION, verify
from hcsd.contract.keyring import Keyring, derive
from hcsd.profiles.database import ProfileDatabase
from tests.cluster.controlplane import ControlPlane, register_node
from tests.harness.waiting import wait_for
from tests.unit.fleet import GiB, node_object

pytestmark = pytest.mark.slow

KEYS = Keyring({"k1": b"0123456789abcdef0123456789abcdef"}, "k1")


@pytest.fixture(scope="module")
def extender(plane: ControlPlane) -> Iterator[Extender]:
    e = Extender(plane.kube("extender"), lambda: KEYS, ProfileDatabase.load(None)).start()
    assert e.state.wait_synced(30)
    yield e
    e.stop()


def add_node(plane: ControlPlane, extender: Extender, name: str) -> None:
    """A Node, its ComputeNode (one A100 80Gi) and a fresh heartbeat, as hcs-syncer writes
    them; back once the extender's informers have them."""
    admin = plane.kube()
    register_node(admin, name)
    obj = node_object(name, count=1)
    status = obj.pop("status")
    del obj["metadata"]["resourceVersion"]
    created = admin.create("/apis/hcs.io/v1alpha1/computenodes", obj)
    admin.replace(
        f"/apis/hcs.io/v1alpha1/computenodes/{name}/status", {**created, "status": status}
    )
    now = micro_time(time.time())
    spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}
    admin.create("/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases",
                 lease_object(f"hcs-node-{name}", "hcs-system", spec))  # fmt: skip
    wait_for(lambda: name in extender.state.snapshot().heartbeats
          and name in extender.state.snapshot().nodes, what=f"{name} in the caches")  # fmt: skip


def create_pod(plane: ControlPlane, name: str, vram: str, namespace: str = "default") -> Any:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"ai.compute/vram": vram}}}]},
    }  # fmt: skip
    return plane.kube().create(f"/api/v1/namespaces/{namespace}/pods", pod)


def bind(extender: Extender, pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    return extender.bind(BindRequest(meta["namespace"], meta["name"], meta["uid"], node))


def test_bind_signs_binds_and_counts_the_pod_at_once(
    plane: ControlPlane, extender: Extender
) -> None:
    add_node(plane, extender, "bind-a")
    first = create_pod(plane, "first", "50Gi")
    second = create_pod(plane, "second", "50Gi")
    assert extender.filter(first, ["bind-a"]).passed == ["bind-a"]
    assert bind(extender, first, "bind-a") == ""
    bound = plane.kube().get("/api/v1/namespaces/default/pods/first")
    assert bound["spec"]["nodeName"] == "bind-a"
    node_keys = derive(KEYS, "bind-a").keys  # signed with bind-a's own key
    body = verify(bound["metadata"]["annotations"][ANNOTATION], node_keys, node="bind-a",
                  pod_uid=first["metadata"]["uid"], now=time.time(), max_age=60)  # fmt: skip
    assert [g.vram_bytes for g in body.containers["main"]] == [50 * GiB]
    # Counted from the moment it was bound (assumed, then as the informer shows it): the
    # second pod does not fit, and binding it anyway fails with the reason.
    why = "container main: A100-SXM4-80GB: 50Gi wanted, most free is 30Gi on A100-SXM4-80GB#0"
    assert extender.filter(second, ["bind-a"]).failed == {"bind-a": why}
    assert bind(extender, second, "bind-a") == f"node bind-a can no longer take the pod: {why}"
    shown = extender.state.pods.items.get
    wait_for(lambda: getattr(shown("default/first"), "node", ""), what="the informer's word")
    assert extender.filter(second, ["bind-a"]).failed == {"bind-a": why}  # counted once
    plane.kube().request("DELETE", "/api/v1/namespaces/default/pods/first",
                         body={"gracePeriodSeconds": 0})  # fmt: skip
    wait_for(lambda: extender.filter(second, ["bind-a"]).passed == ["bind-a"], what="release")


def test_a_failed_binding_gives_its_grants_back(plane: ControlPlane, extender: Extender) -> None:
    add_node(plane, extender, "bind-b")
    taken = create_pod(plane, "taken", "80Gi")
    # Someone else binds it first (without an assignment). The extender's Binding made from
    # its watch's copy, if the copy is still unbound, then fails (409: the pod's version moved)
    # after it has assumed the grants; the pod read again shows it bound: refused.
    plane.kube().create("/api/v1/namespaces/default/pods/taken/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "taken"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "elsewhere"},
    })  # fmt: skip
    assert extender.filter(taken, ["bind-b"]).passed == ["bind-b"]
    errors = extender.metrics.value("hcs_extender_binds_total", result="error")
    assert errors is not None
    assert bind(extender, taken, "bind-b") == "pod default/taken is already bound to elsewhere"
    assert extender.metrics.value("hcs_extender_binds_total", result="error") == errors + 1
    assert extender.filter(taken, ["bind-b"]).passed == ["bind-b"]  # nothing left assumed
    missing = {**taken, "metadata": {**taken["metadata"], "name": "never-made", "uid": "u-0"}}
    assert bind(extender, missing, "bind-b").startswith("bind failed: 404 NotFound")


def test_quota_status_is_written_when_usage_changes(
    plane: ControlPlane, extender: Extender
) -> None:
    admin = plane.kube()
    add_node(plane, extender, "bind-c")
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": "quota-team"}})  # fmt: skip
    admin.create("/apis/hcs.io/v1alpha1/namespaces/quota-team/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": "quota-team"},
        "spec": {"hard": {"vram": "100Gi"}},
    })  # fmt: skip
    wait_for(lambda: extender.state.snapshot().quotas_in("quota-team"), what="the quota")
    pod = create_pod(plane, "counted", "16Gi", namespace="quota-team")
    assert bind(extender, pod, "bind-c") == ""

    def used() -> dict[str, str]:
        (quota,) = extender.state.snapshot().quotas_in("quota-team")
        return dict(quota.status_used)

    assert extender.quota_status.write_changed() == 1
    wait_for(lambda: used().get("vram") == "16Gi", what="the status as the informer sees it")
    assert used() == {"vram": "16Gi", "tflops-fp16": "0", "devices": "1"}
    assert extender.quota_status.write_changed() == 0  # unchanged: nothing written
    admin.request("DELETE", "/api/v1/namespaces/quota-team/pods/counted",
                  body={"gracePeriodSeconds": 0})  # fmt: skip
    wait_for(lambda: extender.state.namespace_usage("quota-team").vram == 0, what="release")
    assert extender.quota_status.write_changed() == 1
    wait_for(lambda: used().get("vram") == "0", what="the status back to zero")
