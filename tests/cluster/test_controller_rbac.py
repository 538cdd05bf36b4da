"""hcs-controller's RBAC (packaging/kubernetes/rbac-controller.yaml) on a real kube-apiserver:
exactly what it calls is allowed, and nothing more.

The API server itself says what the account may do (a SelfSubjectRulesReview as the
controller, in its own namespace and in a tenant's); everything outside the table is refused,
and a few calls an isolation controller could be tempted to make are tried for real.
"""

from __future__ import annotations

import pytest

from hcsd.cluster.kube import KubeError
from tests.cluster.controlplane import ControlPlane

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
