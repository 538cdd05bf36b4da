"""The Kubernetes manifests agree with the code: names, resources, verbs, ports, RBAC, schema.

The cluster tests apply the same files to a real API server; this checks, in milliseconds,
what an API server would accept silently: a field the syncer writes but the CRD schema lacks
is pruned without an error, a renamed ServiceAccount leaves a binding pointing at nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd import __version__
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster import names
from hcsd.cluster.objects import compute_node, node_spec, node_status

ROOT = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes"

# What the code calls, per role: adding a permission means adding it here too.
RBAC = {
    ("ClusterRole", "hcs-syncer"): {
        ("hcs.io", "computenodes"): {"get", "create", "patch"},
        ("hcs.io", "computenodes/status"): {"update"},
    },
    ("Role", "hcs-syncer"): {("coordination.k8s.io", "leases"): {"get", "create", "update"}},
    ("ClusterRole", "hcs-scheduler-extender"): {
        ("hcs.io", "computenodes"): {"get", "list", "watch"},
        ("hcs.io", "computequotas"): {"get", "list", "watch"},
        ("hcs.io", "computequotas/status"): {"patch"},
        ("", "pods"): {"get", "list", "watch", "patch"},
        ("", "pods/binding"): {"create"},
    },
    ("Role", "hcs-scheduler-extender"): {
        ("coordination.k8s.io", "leases"): {"get", "list", "watch", "create", "update"}
    },
}


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / name).read_text()) if d]


def every_object() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((ROOT / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in documents(name)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in every_object() if d["kind"] == kind}


def test_kustomization_lists_every_object_file() -> None:
    listed = set(yaml.safe_load((ROOT / "kustomization.yaml").read_text())["resources"])
    present = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.yaml")}
    assert listed == present - {"kustomization.yaml", "scheduler-config.yaml"}
    for doc in every_object():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], doc


def test_crds_match_the_code() -> None:
    crds = by_kind("CustomResourceDefinition")
    nodes = crds[f"{names.COMPUTE_NODES}.{names.GROUP}"]["spec"]
    quotas = crds[f"{names.COMPUTE_QUOTAS}.{names.GROUP}"]["spec"]
    assert (nodes["group"], nodes["scope"], nodes["names"]["kind"]) == (
        names.GROUP, "Cluster", "ComputeNode"
    )  # fmt: skip
    assert (quotas["group"], quotas["scope"], quotas["names"]["kind"]) == (
        names.GROUP, "Namespaced", "ComputeQuota"
    )  # fmt: skip
    for spec in (nodes, quotas):
        (version,) = spec["versions"]
        assert version["name"] == names.VERSION and version["subresources"] == {"status": {}}
        schema = version["schema"]["openAPIV3Schema"]
        for column in version["additionalPrinterColumns"]:
            if column["jsonPath"].startswith(".metadata"):
                continue
            node = schema
            for part in column["jsonPath"].strip(".").split("."):
                node = node["properties"][part]
            assert node, column
    hard = quotas["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(hard["properties"]["hard"]["properties"]) == set(names.QUOTA_KEYS)


def _validate(value: Any, schema: dict[str, Any], where: str) -> None:
    """The structural subset of OpenAPI v3 the CRDs use; unknown fields are errors."""
    if schema.get("x-kubernetes-int-or-string"):
        assert isinstance(value, (int, str)), where
        return
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), where
        properties = schema.get("properties")
        for key in schema.get("required", []):
            assert key in value, f"{where}.{key} is required"
        if properties is None:
            return
        for key, item in value.items():
            assert key in properties, f"{where}.{key} is not in the schema (would be pruned)"
            _validate(item, properties[key], f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), where
        for i, item in enumerate(value):
            _validate(item, schema["items"], f"{where}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), where
    elif kind == "string":
        assert isinstance(value, str), where
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if "minimum" in schema:
        assert value >= schema["minimum"], where


@pytest.mark.parametrize("health", [pb.HEALTH_STATE_HEALTHY, pb.HEALTH_STATE_UNHEALTHY])
def test_the_syncers_objects_fit_the_schema(health: int) -> None:
    devices = [
        pb.Device(
            uuid=f"GPU-{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
            pci_bus_id=f"0000:1{i}:00.0", vram_bytes=80 * 2**30, tflops_fp16=312.0,
            links=[pb.Link(peer_uuid=f"GPU-{1 - i}", kind="nvlink", gbps=300.0)],
            health_score=100, health_state=health if i else pb.HEALTH_STATE_HEALTHY,
            vram_allocated_bytes=16 * 2**30 if i else 0, compute_allocated_percent=0,
            allocation_count=1 if i else 0,
        )
        for i in range(2)
    ]  # fmt: skip
    allocation = pb.Allocation(
        container_id="c1", pod=pb.PodRef(namespace="ns", name="p", uid="u1"),
        container_name="main", grants=[pb.Grant(device_uuid="GPU-1", vram_bytes=16 * 2**30)],
        source="assignment",
    )  # fmt: skip
    node = pb.Node(name="n1", version=__version__, backends=["nvidia"])
    obj = compute_node("n1", node_spec(node, devices))
    obj["status"] = node_status(devices, [allocation], previous={}, now="2026-01-01T00:00:00Z")
    crd = by_kind("CustomResourceDefinition")["computenodes.hcs.io"]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    _validate({k: v for k, v in obj.items() if k != "metadata"}, schema, "ComputeNode")


def test_rbac_grants_what_the_code_calls_and_no_more() -> None:
    found: dict[tuple[str, str], dict[tuple[str, str], set[str]]] = {}
    for doc in every_object():
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        rules: dict[tuple[str, str], set[str]] = {}
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    rules.setdefault((group, resource), set()).update(rule["verbs"])
        found[(doc["kind"], doc["metadata"]["name"])] = rules
    assert found == RBAC


def test_bindings_service_accounts_and_secret_agree() -> None:
    accounts = by_kind("ServiceAccount")
    assert set(accounts) == {names.SYNCER_ACCOUNT, names.EXTENDER_ACCOUNT}
    for account in accounts.values():
        assert account["metadata"]["namespace"] == names.NAMESPACE
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in by_kind(kind).values():
            (subject,) = binding["subjects"]
            assert subject["name"] in accounts and subject["namespace"] == names.NAMESPACE
            assert binding["roleRef"]["name"] == subject["name"]
    (secret,) = by_kind("Secret").values()
    assert secret["metadata"]["name"] == names.KEY_SECRET
    assert list(secret["stringData"]) == [names.KEY_SECRET_FIELD]


def test_workloads_use_the_right_image_account_key_and_port() -> None:
    daemonset = by_kind("DaemonSet")["hcs-syncer"]["spec"]["template"]["spec"]
    deployment = by_kind("Deployment")["hcs-scheduler-extender"]["spec"]["template"]["spec"]
    assert daemonset["serviceAccountName"] == names.SYNCER_ACCOUNT
    assert deployment["serviceAccountName"] == names.EXTENDER_ACCOUNT
    for pod in (daemonset, deployment):
        (container,) = pod["containers"]
        assert container["image"].endswith(f":{__version__}")
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        assert secrets == [names.KEY_SECRET]
    (extender,) = deployment["containers"]
    assert f"--listen=0.0.0.0:{names.EXTENDER_PORT}" in extender["command"]
    assert extender["ports"][0]["containerPort"] == names.EXTENDER_PORT
    assert extender["readinessProbe"]["httpGet"]["port"] == names.EXTENDER_PORT
    (service,) = by_kind("Service").values()
    assert service["spec"]["ports"][0]["targetPort"] == names.EXTENDER_PORT


def test_scheduler_configuration_names_our_verbs_and_resources() -> None:
    (config,) = documents("scheduler-config.yaml")
    (extender,) = config["extenders"]
    assert extender["urlPrefix"].endswith(f".{names.NAMESPACE}.svc:{names.EXTENDER_PORT}/")
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        names.FILTER_VERB, names.PRIORITIZE_VERB, names.BIND_VERB
    )  # fmt: skip
    assert extender["nodeCacheCapable"] is True
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed == dict.fromkeys(names.MANAGED_RESOURCES, True)
