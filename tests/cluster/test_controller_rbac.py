"""hcs-controller's RBAC (packaging/kubernetes/rbac-controller.yaml) on a real kube-apiserver:
exactly what it calls is allowed, and nothing more.

The API server itself says what the account may do (a SelfSubjectRulesReview as the
controller, in its own namespace and in a tenant's); everything outside the table is refused,
and a few calls an isolation controller could be tempted to make are tried for real.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from tests.cluster.controlplane import ControlPlane, register_node

pytestmark = pytest.mark.slow

# (group, resource, verb, resourceName or "") everywhere: the ClusterRole
CLUSTER = {
    ("hcs.io", "computenodes", "list", ""),
    ("hcs.io", "computenodes", "watch", ""),
    ("hcs.io", "computenodes/status", "patch", ""),
    ("", "pods", "get", ""),
    ("", "pods", "list", ""),
    ("", "pods", "watch", ""),
    ("", "pods/status", "patch", ""),
    ("", "pods/eviction", "create", ""),
    ("", "nodes", "patch", ""),
    ("", "events", "create", ""),
}
# and in the release's namespace: its leader Lease
LEASE = {
    ("coordination.k8s.io", "leases", "get", "hcs-controller"),
    ("coordination.k8s.io", "leases", "update", "hcs-controller"),
    ("coordination.k8s.io", "leases", "create", ""),
}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases"
# what every authenticated user may do (the API server's own bootstrap roles)
SELF_REVIEWS = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}


def rules(plane: ControlPlane, namespace: str) -> set[tuple[str, str, str, str]]:
    kube = plane.kube("controller")
    review = kube.create(
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
         "spec": {"namespace": namespace}},
    )  # fmt: skip
    kube.close()
    found = set()
    for rule in review["status"]["resourceRules"]:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule["resources"]:
                if resource in SELF_REVIEWS:
                    continue
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        found.add((group, resource, verb, name))
    return found


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [("hcs-system", CLUSTER | LEASE), ("tenant-a", CLUSTER)],
    ids=["its own namespace", "a tenant's namespace"],
)
def test_the_controller_may_do_exactly_what_it_calls(
    plane: ControlPlane, namespace: str, expected: set[tuple[str, str, str, str]]
) -> None:
    assert rules(plane, namespace) == expected


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/api/v1/namespaces/default/pods/anything", None),
        ("PATCH", "/api/v1/namespaces/default/pods/anything", {"metadata": {"labels": {"a": "b"}}}),
        ("GET", "/api/v1/nodes/anything", None),
        ("GET", "/api/v1/namespaces/hcs-system/secrets", None),
        ("PATCH", "/apis/hcs.io/v1alpha1/computenodes/anything", {"spec": {}}),
        ("GET", f"{LEASES}/hcs-scheduler-extender", None),
        ("PATCH", "/api/v1/nodes/anything/status", {"status": {}}),
    ],
    ids=["delete a pod", "patch a pod", "read a node", "read secrets", "patch a ComputeNode's spec",
         "read another Lease", "patch a node's status"],
)  # fmt: skip
def test_everything_else_is_refused(
    plane: ControlPlane, method: str, path: str, body: object
) -> None:
    kube = plane.kube("controller")
    try:
        with pytest.raises(KubeError) as refused:
            kube.request(
                method,
                path,
                body=body,
                content_type="application/merge-patch+json"
                if method == "PATCH"
                else "application/json",
            )
        assert refused.value.status == 403, refused.value
    finally:
        kube.close()


# --- admission-controller.yaml: what the patches may change ---------------------------------

CN = "/apis/hcs.io/v1alpha1/computenodes"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FOREIGN = {"key": "example.com/maintenance", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def objects(plane: ControlPlane) -> Iterator[dict[str, str]]:
    """A Node with a foreign taint, a pod bound to it, and its ComputeNode with a status."""
    admin = plane.kube()
    tag = uuid.uuid4().hex[:6]
    node, pod = f"vap-{tag}", f"vap-{tag}"
    register_node(admin, node)
    admin.request("PATCH", f"/api/v1/nodes/{node}", body={"spec": {"taints": [FOREIGN]}},
                  content_type=STRATEGIC)  # fmt: skip
    admin.create("/api/v1/namespaces/default/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    })  # fmt: skip
    spec = {"nodeName": node, "devices": []}
    admin.create(CN, {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeNode",
                      "metadata": {"name": node}, "spec": spec})  # fmt: skip
    current = admin.get(f"{CN}/{node}")
    admin.replace(f"{CN}/{node}/status", {**current, "status": {"phase": "Ready"}})
    yield {"node": f"/api/v1/nodes/{node}", "pod": f"/api/v1/namespaces/default/pods/{pod}",
           "cn": f"{CN}/{node}"}  # fmt: skip
    for path in (f"/api/v1/namespaces/default/pods/{pod}", f"{CN}/{node}", f"/api/v1/nodes/{node}"):
        with contextlib.suppress(KubeError):
            admin.request("DELETE", path)
    admin.close()


def patch(plane: ControlPlane, path: str, body: Any, kind: str = MERGE) -> int:
    kube = plane.kube("controller")
    try:
        kube.request("PATCH", path, body=body, content_type=kind)
        return 200
    except KubeError as e:
        return e.status
    finally:
        kube.close()


def until_enforced(plane: ControlPlane, objects: dict[str, str]) -> None:
    """The policies are compiled a moment after they are created (all three at once): wait
    until a label on the Node is refused (taking back any that got through meanwhile)."""
    deadline = time.monotonic() + 30
    while patch(plane, objects["node"], {"metadata": {"labels": {"vap-probe": "x"}}}) != 403:
        assert time.monotonic() < deadline, "admission-controller.yaml was never enforced"
        admin = plane.kube()
        admin.patch(objects["node"], {"metadata": {"labels": {"vap-probe": None}}})
        admin.close()
        time.sleep(0.3)
    time.sleep(1.0)


def test_on_a_node_only_its_own_taint_may_change(
    plane: ControlPlane, objects: dict[str, str]
) -> None:
    node = objects["node"]
    until_enforced(plane, objects)
    ours = {"key": "hcs.io/accelerator-unhealthy", "effect": "NoSchedule"}
    assert patch(plane, node, {}) == 200  # how it reads a Node
    assert patch(plane, node, [{"op": "add", "path": "/spec/taints/-", "value": ours}],
                 JSON_PATCH) == 200  # fmt: skip
    assert patch(plane, node, [{"op": "remove", "path": "/spec/taints/1"}], JSON_PATCH) == 200
    # the foreign taint, another taint, cordon, labels: refused
    assert patch(plane, node, [{"op": "remove", "path": "/spec/taints/0"}], JSON_PATCH) == 403
    other = {"key": "example.com/other", "effect": "NoExecute"}
    assert patch(plane, node, [{"op": "add", "path": "/spec/taints/-", "value": other}],
                 JSON_PATCH) == 403  # fmt: skip
    assert patch(plane, node, {"spec": {"unschedulable": True}}) == 403
    assert patch(plane, node, {"metadata": {"annotations": {"a": "b"}}}) == 403


def test_on_a_pod_only_the_disruption_condition_may_change(
    plane: ControlPlane, objects: dict[str, str]
) -> None:
    status = objects["pod"] + "/status"
    until_enforced(plane, objects)
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "HCSDeviceFailed",
                 "message": "device x is unhealthy"}  # fmt: skip
    assert patch(plane, status, {"status": {"conditions": [condition]}}, STRATEGIC) == 200
    ready = {"type": "Ready", "status": "False", "reason": "Forged"}
    assert patch(plane, status, {"status": {"conditions": [ready]}}, STRATEGIC) == 403
    assert patch(plane, status, {"status": {"phase": "Failed"}}) == 403
    assert patch(plane, status, {"status": {"podIP": "10.9.9.9"}}) == 403


def test_on_a_compute_node_only_the_fleet_may_change(
    plane: ControlPlane, objects: dict[str, str]
) -> None:
    status = objects["cn"] + "/status"
    until_enforced(plane, objects)
    fleet = {"summary": "1 slow: GPU-0", "slowDevices": [{"uuid": "GPU-0", "efficiency": 0.5}]}
    assert patch(plane, status, {"status": {"fleet": fleet}}) == 200
    assert patch(plane, status, {"status": {"fleet": None}}) == 200
    assert patch(plane, status, {"status": {"phase": "NotReady"}}) == 403
    assert patch(plane, status, {"status": {"devices": []}}) == 403


def post_event(plane: ControlPlane, namespace: str, about: dict[str, Any], reason: str,
               component: str = "hcs-controller") -> int:  # fmt: skip
    """An Event as hcs-controller writes them (healer_actions.post_event's shape)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{about['name']}.{time.time_ns():x}", "namespace": namespace},
        "involvedObject": about, "reason": reason, "message": "m", "type": "Warning",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": component}, "reportingComponent": component,
        "reportingInstance": "test", "action": reason,
    }  # fmt: skip
    kube = plane.kube("controller")
    try:
        kube.create(f"/api/v1/namespaces/{namespace}/events", body)
        return 201
    except KubeError as e:
        return e.status
    finally:
        kube.close()


def test_events_only_about_its_objects_with_its_reasons(
    plane: ControlPlane, objects: dict[str, str]
) -> None:
    until_enforced(plane, objects)
    pod = {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
           "name": objects["pod"].rsplit("/", 1)[1]}  # fmt: skip
    node = {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeNode",
            "name": objects["cn"].rsplit("/", 1)[1]}  # fmt: skip
    deadline = time.monotonic() + 30  # the events policy compiles on its own time
    while post_event(plane, "default", pod, "Forged") != 403:
        assert time.monotonic() < deadline, "the events policy was never enforced"
        time.sleep(0.3)
    for reason in ("HCSDeviceFailed", "HCSDeviceDegraded", "Evicted", "EvictionBlocked",
                   "EvictionSkipped"):  # fmt: skip
        assert post_event(plane, "default", pod, reason) == 201, reason
    for reason in ("PodEvicted", "PodEvictionBlocked", "PodEvictionSkipped", "NodeTainted",
                   "NodeUntainted", "SlowDevices", "SlowDevicesCleared"):  # fmt: skip
        assert post_event(plane, "default", node, reason) == 201, reason
    # a ComputeNode's reason on a pod, and the other way round
    assert post_event(plane, "default", pod, "NodeTainted") == 403
    assert post_event(plane, "default", node, "Evicted") == 403
    # in another component's name
    assert post_event(plane, "default", pod, "Evicted", component="kubelet") == 403
    # about other objects: the Node, a Secret
    assert post_event(plane, "default", {**node, "apiVersion": "v1", "kind": "Node"},
                      "NodeTainted") == 403  # fmt: skip
    secret = {"apiVersion": "v1", "kind": "Secret", "namespace": "default", "name": "x"}
    assert post_event(plane, "default", secret, "Evicted") == 403
    # a ComputeNode's Event in a tenant's namespace (where `kubectl describe` never looks), a
    # pod's in another: the API server's own validation refuses them before the policy does
    admin = plane.kube()
    with contextlib.suppress(KubeError):
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": "tenant-ev"}})  # fmt: skip
    admin.close()
    assert post_event(plane, "tenant-ev", node, "NodeTainted") == 422
    assert post_event(plane, "tenant-ev", pod, "Evicted") == 422
