"""The Kubernetes manifests agree with the code: names, schema, RBAC, commands, ports.

tests/cluster/ applies the same files to a real API server, but only where one can be built.
This checks in well under a second, with no cluster, what an API server would accept
silently or a deployment would only show at run time: a field the syncer writes but the CRD
schema lacks is pruned without an error; a renamed ServiceAccount leaves a binding pointing
at nothing; a port or a flag that drifted makes the extender unreachable.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd import __version__
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.cluster_reader import VIEWER_PODS_ROLE, VIEWER_ROLE
from hcsd.cluster.commands import extender_main, syncer_main
from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.endpoints import PROBE_PORT
from hcsd.cluster.healer_actions import COMPUTE_NODE_EVENTS, POD_EVENTS
from hcsd.cluster.objects import MEASURED_BOUNDS, compute_node, node_spec, node_status
from hcsd.contract import names, paths
from hcsd.quantity import QuantityError, parse_quantity

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "packaging" / "kubernetes"  # rendered from packaging/helm/hcs (make manifests)
SCHEDULER = names.SCHEDULER_NAME  # upstream's kube-scheduler with HCS's profile (scheduler.yaml)
# The Secret's shape only: the operator creates the real one, and `apply -k` must not replace it.
OPERATORS_SECRET = "secret.yaml"
IMAGE = f"registry.example/hcs/hcs-cluster:{__version__}"  # a placeholder: kustomize images:

Rules = dict[tuple[str, str], frozenset[str]]  # (apiGroup, resource) -> verbs

# What the code calls, per role (hcsd/cluster/syncer.py, state.py, binding.py,
# quota_status.py, informer.py, leader.py).
# A permission added to a manifest without a line here fails the test: least privilege.
RBAC: dict[tuple[str, str], Rules] = {
    ("ClusterRole", names.SYNCER_ACCOUNT): {
        # GET at start, POST when absent, merge-PATCH of spec
        (names.GROUP, names.COMPUTE_NODES): frozenset({"get", "create", "patch"}),
        (names.GROUP, f"{names.COMPUTE_NODES}/status"): frozenset({"update"}),  # PUT status
        # the kubelet DRA plugin (hcsd/cluster/kubeletplugin/claims.py) reads each claim
        ("resource.k8s.io", "resourceclaims"): frozenset({"get"}),
        # ... and the RuntimeProfile a claim names (kubeletplugin/profiles.py)
        (names.GROUP, names.RUNTIME_PROFILES): frozenset({"get"}),
    },
    ("Role", names.SYNCER_ACCOUNT): {
        # the heartbeat Lease: GET, POST when absent, PUT to renew
        ("coordination.k8s.io", "leases"): frozenset({"get", "create", "update"}),
    },
    ("ClusterRole", names.EXTENDER_ACCOUNT): {
        (names.GROUP, names.COMPUTE_NODES): frozenset({"list", "watch"}),  # informer
        (names.GROUP, names.COMPUTE_QUOTAS): frozenset({"list", "watch"}),  # informer
        (names.GROUP, names.RUNTIME_PROFILES): frozenset({"list", "watch"}),  # informer
        (names.GROUP, f"{names.COMPUTE_QUOTAS}/status"): frozenset({"patch"}),  # status.used
        # informer; GET in bind; merge-PATCH of one annotation (requeue.py) and a patch of the
        # images of a pod naming a RuntimeProfile (rebinding.py), narrowed by
        # admission-requeue.yaml
        ("", "pods"): frozenset({"get", "list", "watch", "patch"}),
        ("", "pods/binding"): frozenset({"create"}),  # carries the assignment annotation
        ("authentication.k8s.io", "tokenreviews"): frozenset({"create"}),  # node keys' callers
    },
    ("Role", names.EXTENDER_ACCOUNT): {
        # list+watch: the nodes' heartbeats; get/create/update: the leader Lease
        ("coordination.k8s.io", "leases"): frozenset({"get", "list", "watch", "create", "update"}),
    },
    # hcsd/cluster/healer*.py: informers; GET of a pod before acting; the DisruptionTarget
    # condition; the eviction; the taint (JSON patch; the Node read from an empty patch's
    # answer); status.fleet; Events
    ("ClusterRole", names.CONTROLLER_ACCOUNT): {
        (names.GROUP, names.COMPUTE_NODES): frozenset({"list", "watch"}),
        (names.GROUP, f"{names.COMPUTE_NODES}/status"): frozenset({"patch"}),
        ("", "pods"): frozenset({"get", "list", "watch"}),
        ("", "pods/status"): frozenset({"patch"}),
        ("", "pods/eviction"): frozenset({"create"}),
        ("", "nodes"): frozenset({"patch"}),
        ("", "events"): frozenset({"create"}),
    },
    ("Role", names.CONTROLLER_ACCOUNT): {
        # its leader Lease by name (get, PUT to renew); create cannot name it
        ("coordination.k8s.io", f"leases:{names.CONTROLLER_LEASE}"): frozenset({"get", "update"}),
        ("coordination.k8s.io", "leases"): frozenset({"create"}),
    },
    # People, not an account (no binding shipped): hcsctl cluster's lists (cluster_reader.py),
    # and get/watch for `kubectl get`; the heartbeats in hcs-system; the pods apart (they
    # expose every pod's spec).
    ("ClusterRole", VIEWER_ROLE): {
        (names.GROUP, names.COMPUTE_NODES): frozenset({"get", "list", "watch"}),
        (names.GROUP, names.COMPUTE_QUOTAS): frozenset({"get", "list", "watch"}),
        (names.GROUP, names.RUNTIME_PROFILES): frozenset({"get", "list", "watch"}),
    },
    ("Role", VIEWER_ROLE): {
        ("coordination.k8s.io", "leases"): frozenset({"get", "list"}),
    },
    ("ClusterRole", VIEWER_PODS_ROLE): {
        ("", "pods"): frozenset({"list"}),
    },
}


# --- loading -------------------------------------------------------------------------------


def yaml_files() -> list[str]:
    """Every YAML file under packaging/kubernetes, relative: what the test and kustomize see."""
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.y*ml"))


def documents(name: str) -> list[dict[str, Any]]:
    """The non-empty documents of one file (a trailing `---` yields None, which is no object)."""
    return [d for d in yaml.safe_load_all((ROOT / name).read_text()) if d is not None]


def kustomized() -> list[str]:
    return list(yaml.safe_load((ROOT / "kustomization.yaml").read_text())["resources"])


def scheduler_config() -> dict[str, Any]:
    """hcs-scheduler's KubeSchedulerConfiguration (its ConfigMap's config.yaml)."""
    (config_map,) = [d for d in documents("scheduler.yaml") if d["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def every_object() -> list[dict[str, Any]]:
    return [d for name in kustomized() for d in documents(name)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in every_object() if d["kind"] == kind}


def crd(plural: str) -> dict[str, Any]:
    return by_kind("CustomResourceDefinition")[f"{plural}.{names.GROUP}"]


def crd_schema(plural: str) -> dict[str, Any]:
    (version,) = crd(plural)["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(kind)[name]["spec"]["template"]["spec"]
    return spec


# --- files and objects ---------------------------------------------------------------------


@pytest.mark.parametrize("name", yaml_files())
def test_every_file_says_what_it_is_and_every_document_is_an_object(name: str) -> None:
    """A reader of a file alone learns its purpose; kubectl needs apiVersion, kind, name."""
    assert (ROOT / name).read_text().startswith("#"), f"{name}: no comment at the top"
    docs = documents(name)
    assert docs, f"{name} is empty"
    for doc in docs:
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), name
        if name != "kustomization.yaml":
            assert doc.get("metadata", {}).get("name"), f"{name}: a {doc['kind']} with no name"


def test_kustomization_lists_every_object_file_and_only_existing_ones() -> None:
    """A file left out is never applied; a file listed but missing breaks `apply -k`."""
    listed = kustomized()
    assert len(listed) == len(set(listed)), "a file listed twice"
    assert set(listed) == set(yaml_files()) - {"kustomization.yaml", OPERATORS_SECRET}


def test_apply_k_creates_no_secret() -> None:
    """`kubectl apply -k` after the operator created the key must keep the key: no Secret in
    the kustomization (a listed one would be replaced by its placeholder on every apply)."""
    assert OPERATORS_SECRET not in kustomized()
    assert "Secret" not in {d["kind"] for d in every_object()}


def test_every_namespaced_object_lives_in_our_namespace() -> None:
    """The syncers' and the extender's --namespace default is names.NAMESPACE."""
    (namespace,) = by_kind("Namespace")
    assert namespace == names.NAMESPACE
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration",
    }
    # kube-scheduler reads the API server's client CA where it is, in kube-system.
    elsewhere = {("RoleBinding", f"{SCHEDULER}-authentication-reader"): "kube-system"}
    for doc in every_object():
        if (doc["kind"], doc["metadata"]["name"]) in elsewhere:
            assert doc["metadata"]["namespace"] == elsewhere[doc["kind"], doc["metadata"]["name"]]
        elif doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == names.NAMESPACE, doc["metadata"]
        else:
            assert "namespace" not in doc["metadata"], doc["metadata"]


# --- CRDs: names, structure, printer columns ------------------------------------------------


@pytest.mark.parametrize(
    ("plural", "kind", "scope", "short"),
    [
        (names.COMPUTE_NODES, names.COMPUTE_NODE_KIND, "Cluster", "cn"),
        (names.COMPUTE_QUOTAS, names.COMPUTE_QUOTA_KIND, "Namespaced", "cq"),
        (names.RUNTIME_PROFILES, names.RUNTIME_PROFILE_KIND, "Cluster", "rtp"),
    ],
)
def test_crd_names_match_the_code(plural: str, kind: str, scope: str, short: str) -> None:
    """The code builds paths from names.GROUP/VERSION/plural: a mismatch is a 404 at run time."""
    spec = crd(plural)["spec"]
    assert (spec["group"], spec["scope"]) == (names.GROUP, scope)
    assert spec["names"] == {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
        "shortNames": [short],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (names.VERSION, True, True)
    if plural == names.RUNTIME_PROFILES:  # written by people only, and no status
        assert "subresources" not in version
    else:
        assert version["subresources"] == {"status": {}}  # status written apart from spec


def structural_problems(schema: Mapping[str, Any], where: str = "") -> Iterator[str]:
    """What makes a CRD schema non-structural, as far as these CRDs could go wrong: a node
    without a type, or anyOf other than the exact int-or-string form, which the API server
    refuses (a pattern must sit beside that anyOf, not inside it)."""
    if schema.get("x-kubernetes-int-or-string"):
        if schema.get("anyOf") != [{"type": "integer"}, {"type": "string"}] or "type" in schema:
            yield f"{where}: int-or-string needs exactly anyOf [integer, string] and no type"
    elif "type" not in schema:
        yield f"{where}: no type"
    elif "anyOf" in schema or "oneOf" in schema or "allOf" in schema:
        yield f"{where}: anyOf/oneOf/allOf beside a type"
    for key, sub in (schema.get("properties") or {}).items():
        yield from structural_problems(sub, f"{where}.{key}")
    if "items" in schema:
        yield from structural_problems(schema["items"], f"{where}[]")


CRDS = [names.COMPUTE_NODES, names.COMPUTE_QUOTAS, names.RUNTIME_PROFILES]


@pytest.mark.parametrize("plural", CRDS)
def test_crd_schemas_are_structural(plural: str) -> None:
    assert list(structural_problems(crd_schema(plural))) == []


def schema_at(schema: Mapping[str, Any], json_path: str) -> Mapping[str, Any] | None:
    """The sub-schema a simple `.a.b.c` jsonPath names, or None when the schema lacks it."""
    node: Mapping[str, Any] | None = schema
    simple = re.sub(r"\[[^\]]*\]", "[]", json_path)  # `a[*]`, `a[?(@.b=="c")]`: a's items
    for part in simple.removeprefix(".").split("."):
        name, _, index = part.partition("[")
        node = (node or {}).get("properties", {}).get(name)
        if index:
            node = (node or {}).get("items")
    return node


@pytest.mark.parametrize("plural", CRDS)
def test_printer_columns_show_fields_that_exist(plural: str) -> None:
    """A column on a misspelt path is always empty, and kubectl says nothing about it."""
    (version,) = crd(plural)["spec"]["versions"]
    schema = crd_schema(plural)
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if path == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        found = schema_at(schema, path)
        assert found is not None, f"{plural}: column {column['name']} shows {path}, not in schema"
        expected = "string" if found.get("x-kubernetes-int-or-string") else found["type"]
        assert column["type"] == expected, column


# --- the syncer's and extender's objects against the schemas --------------------------------

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
INT64 = range(-(2**63), 2**63)


def validate(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    """The structural subset of OpenAPI v3 these CRDs use, as the API server applies it.

    Unknown properties are errors here although the API server would accept them: it prunes
    them silently, and a field that vanishes on write is the bug this test exists to catch.
    """
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            yield f"{where}: {value!r} is neither an integer nor a string"
        elif isinstance(value, str) and not re.search(schema.get("pattern", ""), value):
            yield f"{where}: {value!r} does not match {schema['pattern']}"
        return
    yield from CHECKS[schema["type"]](value, schema, where)
    if "enum" in schema and value not in schema["enum"]:
        yield f"{where}: {value!r} not in {schema['enum']}"


def _object(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{where}: {value!r} is not an object"
        return
    for key in schema.get("required", ()):
        if key not in value:
            yield f"{where}.{key} is required"
    properties = schema.get("properties")
    if properties is None:  # e.g. metadata: anything goes
        return
    for key, item in value.items():
        if key not in properties:
            yield f"{where}.{key} is not in the schema: the API server would prune it"
        else:
            yield from validate(item, properties[key], f"{where}.{key}")


def _array(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if not isinstance(value, list):
        yield f"{where}: {value!r} is not an array"
        return
    if len(value) > schema.get("maxItems", len(value)):
        yield f"{where}: {len(value)} items, over maxItems {schema['maxItems']}"
    for i, item in enumerate(value):
        yield from validate(item, schema["items"], f"{where}[{i}]")
    keys = schema.get("x-kubernetes-list-map-keys")
    if keys:
        seen = [tuple(item.get(k) for k in keys) for item in value]
        if len(seen) != len(set(seen)):
            yield f"{where}: duplicate keys {keys} in a list-type map"


def _number(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    integral = schema["type"] == "integer"
    if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
        yield f"{where}: {value!r} is not {'an integer' if integral else 'a number'}"
        return
    if schema.get("format") == "int64" and value not in INT64:
        yield f"{where}: {value} does not fit int64"
    if value < schema.get("minimum", value):
        yield f"{where}: {value} < minimum {schema['minimum']}"
    if value > schema.get("maximum", value):
        yield f"{where}: {value} > maximum {schema['maximum']}"


def _string(value: Any, schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if not isinstance(value, str):
        yield f"{where}: {value!r} is not a string"
        return
    if len(value) < schema.get("minLength", 0):
        yield f"{where}: {value!r} is shorter than {schema['minLength']}"
    if len(value) > schema.get("maxLength", len(value)):
        yield f"{where}: {len(value)} characters, over maxLength {schema['maxLength']}"
    if "pattern" in schema and not re.search(schema["pattern"], value):
        yield f"{where}: {value!r} does not match {schema['pattern']}"
    if schema.get("format") == "date-time" and not RFC3339.match(value):
        yield f"{where}: {value!r} is not an RFC 3339 date-time"


def _boolean(value: Any, _schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if not isinstance(value, bool):
        yield f"{where}: {value!r} is not a boolean"


CHECKS: dict[str, Callable[[Any, Mapping[str, Any], str], Iterator[str]]] = {
    "object": _object,
    "array": _array,
    "integer": _number,
    "number": _number,
    "string": _string,
    "boolean": _boolean,
}


def problems(obj: Mapping[str, Any], plural: str) -> list[str]:
    return list(validate(dict(obj), crd_schema(plural), plural))


def device(i: int, vendor: str, health: pb.HealthState, **extra: Any) -> pb.Device:
    """A device as hcsd reports it, with every field node_spec/node_status read set."""
    return pb.Device(
        uuid=f"{vendor}-{i}",
        vendor=vendor,
        model="A100-SXM4-80GB" if vendor == "nvidia" else "Ascend910B",
        index=i,
        pci_bus_id=f"0000:1{i}:00.0",
        numa_node=-1 if i else 0,
        vram_bytes=80 * 2**30,
        tflops_fp16=312.0,
        tflops_bf16=312.0,
        tflops_fp32=19.5,
        tops_int8=624.0,
        health_score=100 if health == pb.HEALTH_STATE_HEALTHY else 10,
        health_state=health,
        **extra,
    )


NODES: dict[str, tuple[list[pb.Device], list[pb.Allocation]]] = {
    "empty": ([], []),
    "mixed": (
        [
            device(
                0,
                "nvidia",
                pb.HEALTH_STATE_HEALTHY,
                links=[pb.Link(peer_uuid="nvidia-1", kind="nvlink", gbps=300.0)],
                vram_allocated_bytes=16 * 2**30,
                compute_allocated_percent=50,
                allocation_count=2,
                attributes={  # measured on the node (hcsd.benchmarks): spec.devices[].measured
                    "fingerprint": "measured",
                    "measured_tflops_fp16": "296.400",
                    "measured_ratio": "0.9500",
                    "measured_bandwidth_gbps": "1650.0",
                    "measured_at": "2026-01-01T00:00:00Z",
                },
            ),
            device(
                1,
                "nvidia",
                pb.HEALTH_STATE_DEGRADED,
                links=[pb.Link(peer_uuid="nvidia-0", kind="nvlink", gbps=300.0)],
                attributes={"health_reason": "xid-48: double-bit ECC error"},
            ),
            device(
                2,
                "nvidia",
                pb.HEALTH_STATE_DEGRADED,
                attributes={
                    "health_reason": "hw-slowdown: clock event reasons 0x8 (hw-slowdown)",
                    "health_cause": "hw-slowdown,pcie-link-width",
                    "subhealth": "hw-slowdown,pcie-link-width",
                    "subhealth_node": "hw-power-brake",
                },
            ),
            device(0, "ascend", pb.HEALTH_STATE_LOST),
        ],
        [
            pb.Allocation(
                container_id="c1",
                pod=pb.PodRef(namespace="ns", name="p", uid="u1"),
                container_name="main",
                grants=[pb.Grant(device_uuid="nvidia-0", vram_bytes=8 * 2**30, compute_percent=50)],
                source="assignment",
            ),
            pb.Allocation(  # a local allocation (hcsctl): no pod
                container_id="c0",
                grants=[pb.Grant(device_uuid="nvidia-0", vram_bytes=8 * 2**30)],
                source="local",
            ),
        ],
    ),
    "all-unhealthy": ([device(0, "nvidia", pb.HEALTH_STATE_UNHEALTHY)], []),
}


@pytest.mark.parametrize("node", sorted(NODES))
def test_the_syncers_compute_nodes_fit_the_schema(node: str) -> None:
    """Every field node_spec/node_status write is in the CRD, with the type they write."""
    devices, allocations = NODES[node]
    info = pb.Node(name=node, version=__version__, backends=["nvidia", "ascend"])
    obj = compute_node(node, node_spec(info, devices))
    assert obj["apiVersion"] == names.API_VERSION and obj["kind"] == "ComputeNode"
    first = node_status(devices, allocations, previous={}, now="2026-01-01T00:00:00Z")
    obj["status"] = node_status(
        devices, allocations, previous=first, now="2026-01-02T00:00:00Z", key_ids=["k1", "k2"]
    )
    assert problems(obj, names.COMPUTE_NODES) == []


def test_the_fabric_hcsd_reports_fits_the_schema() -> None:
    """spec.fabric as the syncer writes it, at its caps: too many ports and notes, too long."""
    info = pb.Node(
        name="n", fabric_domain="ib:fec0:0000:0000:0001", fabric_source="infiniband",
        fabric_ports=[f"mlx5_{i}/1 InfiniBand 400 Gb/sec (4X NDR) " + "x" * 300 for i in range(70)],
        fabric_notes=["n" * 2000] * 9,
    )  # fmt: skip
    obj = compute_node("n", node_spec(info, NODES["mixed"][0]))
    assert problems(obj, names.COMPUTE_NODES) == []
    assert obj["spec"]["fabric"]["source"] == "infiniband"


@pytest.mark.parametrize(
    "text", ["", "ib:fec0:0000:0000:0001", "roce/pod-a_1.x", "-a", "a b", "a\nb", "x" * 64,
             "x" * 65, "é"],
)  # fmt: skip
def test_the_fabric_domain_pattern_is_the_settings(text: str) -> None:
    """What discovery.fabric_domain accepts, the CRD accepts, and nothing else."""
    fabric = crd_schema(names.COMPUTE_NODES)["properties"]["spec"]["properties"]["fabric"]
    domain = fabric["properties"]["domain"]
    ours = text == "" or bool(names.FABRIC_DOMAIN.fullmatch(text))
    theirs = bool(re.search(domain["pattern"], text)) and len(text) <= domain["maxLength"]
    assert ours == theirs, text


def test_the_validator_rejects_what_the_api_server_would_prune_or_refuse() -> None:
    """The check above is only as good as its validator: show it fails where it should."""
    devices, allocations = NODES["mixed"]
    obj = compute_node("n", node_spec(pb.Node(name="n"), devices))
    obj["status"] = node_status(devices, allocations, previous={}, now="2026-01-01T00:00:00Z")
    obj["spec"]["devices"][0]["smClock"] = 1410  # unknown: pruned
    obj["spec"]["devices"][1]["vramBytes"] = 80.0  # a float where an int64 is
    obj["spec"]["devices"][2]["vendor"] = "intel"
    del obj["spec"]["devices"][2]["model"]
    obj["status"]["conditions"][0]["lastTransitionTime"] = "yesterday"
    found = "\n".join(problems(obj, names.COMPUTE_NODES))
    for expected in ("smClock", "vramBytes", "intel", "model is required", "yesterday"):
        assert expected in found


def _uncapped(schema: Mapping[str, Any], where: str) -> Iterator[str]:
    if schema.get("type") == "array":
        if "maxItems" not in schema:
            yield where
        yield from _uncapped(schema["items"], f"{where}[]")
    elif schema.get("type") == "string" and not {"enum", "format", "maxLength"} & set(schema):
        yield where
    for key, item in schema.get("properties", {}).items():
        yield from _uncapped(item, f"{where}.{key}")


def test_every_list_and_free_string_of_a_compute_node_is_capped() -> None:
    """The extender holds every ComputeNode in memory and exports per-device series: no
    field may grow without end (apiVersion and kind are the API server's own)."""
    schema = crd_schema(names.COMPUTE_NODES)
    found = list(_uncapped(schema, "computenode"))
    assert found == ["computenode.apiVersion", "computenode.kind"]


def test_the_largest_node_hcsd_writes_fits_the_caps() -> None:
    """16 devices with NVML's longest UUIDs and names, all sick with the longest reason the
    health watcher writes (an event code and 120 characters of its kernel line), each shared
    by 64 containers."""
    reason = {
        "health_reason": "xid-79: " + "x" * 120,
        "health_cause": "x" * 2000,
        "subhealth": ",".join(["x" * 100] * 20),
        "subhealth_node": ",".join(["y" * 100] * 20),
    }
    devices = [device(i, "nvidia", pb.HEALTH_STATE_UNHEALTHY, attributes=reason) for i in range(16)]
    for d in devices:
        d.uuid = f"GPU-{d.index:02d}" + "f" * 76
        d.model = "M" * 95
    allocations = [
        pb.Allocation(container_id=f"{n:064x}", grants=[pb.Grant(device_uuid=d.uuid, vram_bytes=1)])
        for n, d in enumerate(devices * 64)
    ]
    obj = compute_node("n", node_spec(pb.Node(name="n" * 253), devices))
    obj["status"] = node_status(devices, allocations, previous={}, now="2026-01-01T00:00:00Z")
    assert problems(obj, names.COMPUTE_NODES) == []
    obj["spec"]["devices"][0]["model"] = "M" * 257
    obj["spec"]["devices"] *= 17
    found = "\n".join(problems(obj, names.COMPUTE_NODES))
    assert "over maxLength 256" in found and "272 items, over maxItems 256" in found


def test_the_extenders_quota_status_and_a_users_quota_fit_the_schema() -> None:
    """status.used is what Amounts.as_status writes; spec.hard takes ints and quantities."""
    quota = {
        "apiVersion": names.API_VERSION,
        "kind": "ComputeQuota",
        "spec": {"hard": {names.QUOTA_VRAM: "64Gi", names.QUOTA_TFLOPS: "500", "devices": 8}},
        "status": {"used": Amounts(vram=3 * 2**30, tflops=156.5, devices=2).as_status()},
    }
    assert problems(quota, names.COMPUTE_QUOTAS) == []
    hard = crd_schema(names.COMPUTE_QUOTAS)["properties"]["spec"]["properties"]["hard"]
    assert list(hard["properties"]) == list(names.QUOTA_KEYS)
    used = crd_schema(names.COMPUTE_QUOTAS)["properties"]["status"]["properties"]["used"]
    assert list(used["properties"]) == list(names.QUOTA_KEYS)


QUANTITIES = [
    *["64Gi", "500", "8", "0", "+8", "1.5", ".5", "5.", "100m", "2k", "1e3", "1E3", "3E"],
    *["1e-3", "1Ei", "-1", "-1Gi", "", "Gi", "1.2.3", "5Gb", "5 Gi", "0x10", "1e", "lots"],
    *["1ki", "1KI", "1i", "1Gii", "+-1"],
]


@pytest.mark.parametrize("text", QUANTITIES)
def test_the_quota_pattern_admits_what_the_extender_parses(text: str) -> None:
    """A quota the API server accepts but the extender cannot read is ignored quietly; one the
    extender could read but the API server refuses is a confusing error. Negatives are out."""
    hard = crd_schema(names.COMPUTE_QUOTAS)["properties"]["spec"]["properties"]["hard"]
    try:
        parses = parse_quantity(text) >= 0
    except QuantityError:
        parses = False
    for key in names.QUOTA_KEYS:
        assert bool(re.search(hard["properties"][key]["pattern"], text)) == parses, (key, text)


# --- RBAC, accounts, bindings, the Secret ---------------------------------------------------


def rules_of(role: Mapping[str, Any]) -> Rules:
    """A role's rules flattened per (group, resource), so their grouping does not matter; a
    rule limited to names counts per `resource:name`."""
    found: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) - {"resourceNames"} == {"apiGroups", "resources", "verbs"}, rule  # no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [""]:
                    key = f"{resource}:{name}" if name else resource
                    found.setdefault((group, key), set()).update(rule["verbs"])
    return {key: frozenset(verbs) for key, verbs in found.items()}


def hcs_roles() -> list[dict[str, Any]]:
    """The roles of HCS's own programs (hcs-scheduler is upstream's kube-scheduler: below)."""
    return [
        d
        for d in every_object()
        if d["kind"] in ("ClusterRole", "Role") and d["metadata"]["name"] != SCHEDULER
    ]


def test_rbac_grants_what_the_code_calls_and_no_more() -> None:
    roles = {(doc["kind"], doc["metadata"]["name"]): rules_of(doc) for doc in hcs_roles()}
    assert roles == RBAC


def test_bindings_tie_each_account_to_its_own_roles() -> None:
    """Each account gets its ClusterRole and its Role in hcs-system (where the Leases are)."""
    accounts = by_kind("ServiceAccount")
    assert set(accounts) == {
        names.SYNCER_ACCOUNT,
        names.EXTENDER_ACCOUNT,
        names.CONTROLLER_ACCOUNT,
        SCHEDULER,
    }
    roles = {(d["kind"], d["metadata"]["name"]) for d in hcs_roles()}
    bound = set()
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for name, binding in by_kind(kind).items():
            if binding["subjects"][0]["name"] == SCHEDULER:
                continue
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": name, "namespace": names.NAMESPACE}
            ]
            ref = binding["roleRef"]
            assert ref == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name}
            assert (role_kind, name) in roles
            bound.add((role_kind, name))
    viewers = {
        ("ClusterRole", VIEWER_ROLE),
        ("Role", VIEWER_ROLE),
        ("ClusterRole", VIEWER_PODS_ROLE),
    }
    assert bound == set(RBAC) - viewers  # bound by the operator


def test_hcs_scheduler_gets_kube_schedulers_roles_and_its_own_lease_role_only() -> None:
    """The bootstrap roles kube-scheduler itself runs with, the API server's client CA in
    kube-system, and a Role for its own leader Lease. Not narrow: `system:kube-scheduler`
    grants creating any Lease and get/update of every Lease named kube-scheduler (kube-system's
    included), leasecandidates, deleting and binding pods (docs/helm.md, "Placement"); this
    checks that nothing beyond those bindings is granted."""
    refs = {
        (d["kind"], d["metadata"].get("namespace", ""), d["roleRef"]["kind"], d["roleRef"]["name"])
        for d in every_object()
        if d["kind"].endswith("Binding") and "subjects" in d
        for subject in d["subjects"]
        if subject == {"kind": "ServiceAccount", "name": SCHEDULER, "namespace": names.NAMESPACE}
    }
    assert refs == {
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
        ("RoleBinding", names.NAMESPACE, "Role", SCHEDULER),
    }
    (role,) = [
        d for d in every_object() if d["kind"] == "Role" and d["metadata"]["name"] == SCHEDULER
    ]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [SCHEDULER],
            "verbs": ["get", "update"],
        },
    ]
    config = scheduler_config()
    assert config["leaderElection"]["resourceName"] == SCHEDULER
    assert config["leaderElection"]["resourceNamespace"] == names.NAMESPACE


def test_the_secret_holds_keys_by_id_and_names_the_signing_one() -> None:
    """The layout hcsd.contract.keyring_files.read_secret_dir reads: `<kid>.key` and `signing`."""
    (secret,) = documents(OPERATORS_SECRET)
    name = secret["metadata"]["name"]
    assert name == names.KEY_SECRET and secret["type"] == "Opaque"
    assert secret["stringData"] == {"k1.key": "REPLACE-WITH-32-RANDOM-BYTES", "signing": "k1"}
    text = (ROOT / "secret.yaml").read_text()
    assert "create secret generic " + names.KEY_SECRET in text
    assert "--from-literal=k1.key=" in text and "--from-literal=signing=k1" in text


# --- workloads: image, account, key, commands, ports ----------------------------------------


class _Parsed(Exception):
    """Raised to stop a program right after it parsed its arguments."""

    def __init__(self, parsed: argparse.Namespace) -> None:
        super().__init__()
        self.parsed = parsed


def parse_command(
    main: Callable[[Sequence[str] | None], int],
    argv: Sequence[str],
    monkeypatch: pytest.MonkeyPatch,
) -> argparse.Namespace:
    """The program's own parser applied to the manifest's command, stopping right after:
    an unknown or misspelt flag fails here rather than in a crash-looping pod."""
    original = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        raise _Parsed(original(self, *args, **kwargs))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(_Parsed) as caught:
        main(list(argv))
    return caught.value.parsed


def mounts(pod: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume mounted there, for the pod's one container."""
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}


def key_path(pod: Mapping[str, Any]) -> str:
    """Where the pod sees the Secret's keys: the mount of the volume of Secret KEY_SECRET."""
    (path,) = [
        p
        for p, v in mounts(pod).items()
        if v.get("secret", {}).get("secretName") == names.KEY_SECRET
    ]
    return path


def env_field(pod: Mapping[str, Any], name: str) -> str:
    (container,) = pod["containers"]
    (var,) = [e for e in container["env"] if e["name"] == name]
    return str(var["valueFrom"]["fieldRef"]["fieldPath"])


@pytest.mark.parametrize(
    ("kind", "name", "account"),
    [
        ("DaemonSet", names.SYNCER_ACCOUNT, names.SYNCER_ACCOUNT),
        ("Deployment", names.EXTENDER_ACCOUNT, names.EXTENDER_ACCOUNT),
        ("Deployment", names.CONTROLLER_ACCOUNT, names.CONTROLLER_ACCOUNT),
    ],
)
def test_workloads_run_our_image_as_our_account(kind: str, name: str, account: str) -> None:
    pod = pod_spec(kind, name)
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert pod["serviceAccountName"] == account
    assert container["command"][0] == name  # the console script of the same name
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert name in scripts
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_the_syncer_mounts_only_the_api_socket_directory_and_holds_no_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The socket's own directory, read-only, is its one host path: not /run/hcsd (every
    container's quota files), not /etc/hcsd; no key Secret. Its keys come from the extender
    with a token of audience hcs-node-keys bound to the pod."""
    pod = pod_spec("DaemonSet", names.SYNCER_ACCOUNT)
    (container,) = pod["containers"]
    args = parse_command(syncer_main, container["command"][1:], monkeypatch)
    host = {p: v["hostPath"]["path"] for p, v in mounts(pod).items() if "hostPath" in v}
    assert args.socket == paths.SOCKET
    assert host == {paths.API_DIR: paths.API_DIR}
    (socket_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == paths.API_DIR]
    assert socket_mount["readOnly"] is True
    assert not [v for v in mounts(pod).values() if "secret" in v]
    token = mounts(pod)[str(Path(args.token_file).parent)]["projected"]["sources"]
    assert token == [
        {
            "serviceAccountToken": {
                "audience": names.NODE_KEYS_AUDIENCE,
                "expirationSeconds": 3600,
                "path": Path(args.token_file).name,
            }
        }
    ]
    host_name = f"{names.EXTENDER_ACCOUNT}.{names.NAMESPACE}.svc"
    assert args.node_keys_url == f"https://{host_name}:{names.NODE_KEYS_PORT}/node-keys"
    ca = mounts(pod)[str(Path(args.node_keys_ca).parent)]
    assert ca == {"name": "node-keys-ca", "configMap": {"name": names.NODE_KEYS_CA}}
    assert args.namespace == names.NAMESPACE
    assert env_field(pod, "NODE_NAME") == "spec.nodeName"
    assert {"operator": "Exists"} in pod["tolerations"]  # runs on tainted accelerator nodes


def test_one_extender_port_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler -> Service -> container: the scheduling port, names.EXTENDER_PORT, over
    mutual TLS with the mounted files; probes -> the probe port, PROBE_PORT, in plain HTTP."""
    pod = pod_spec("Deployment", names.EXTENDER_ACCOUNT)
    (container,) = pod["containers"]
    args = parse_command(extender_main, container["command"][1:], monkeypatch)
    assert args.listen.rpartition(":")[2] == str(names.EXTENDER_PORT)
    assert args.probe_listen.rpartition(":")[2] == str(PROBE_PORT)
    assert args.keys_dir == key_path(pod)
    assert args.node_keys_listen.rpartition(":")[2] == str(names.NODE_KEYS_PORT)
    # The node-keys port serves the extender's own certificate (to the syncers)
    assert (args.node_keys_cert, args.node_keys_key) == (args.tls_cert, args.tls_key)
    assert args.node_keys_insecure_http is False
    assert args.leader_elect is True and args.namespace == names.NAMESPACE
    assert not args.insecure_plain_http
    tls = {p: v["secret"]["secretName"] for p, v in mounts(pod).items() if "secret" in v}
    assert tls["/etc/hcs-tls"] == "hcs-scheduler-extender-tls"
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca):
        assert str(Path(path).parent) == "/etc/hcs-tls"
    assert env_field(pod, "POD_NAME") == "metadata.name"  # the leader Lease's identity
    ports = [p["containerPort"] for p in container["ports"]]
    assert ports == [names.EXTENDER_PORT, PROBE_PORT, names.NODE_KEYS_PORT]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": PROBE_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": PROBE_PORT}
    service = by_kind("Service")[names.EXTENDER_ACCOUNT]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        (names.EXTENDER_PORT, names.EXTENDER_PORT),
        (PROBE_PORT, PROBE_PORT),
        (names.NODE_KEYS_PORT, names.NODE_KEYS_PORT),
    ]
    labels = by_kind("Deployment")[names.EXTENDER_ACCOUNT]["spec"]["template"]["metadata"]
    assert service["spec"]["selector"].items() <= labels["labels"].items()
    (extender,) = scheduler_config()["extenders"]
    host = f"{names.EXTENDER_ACCOUNT}.{names.NAMESPACE}.svc"
    assert extender["urlPrefix"] == f"https://{host}:{names.EXTENDER_PORT}/"
    assert extender["enableHTTPS"] is True
    assert set(extender["tlsConfig"]) == {"certFile", "keyFile", "caFile"}
    # It binds only hcs-scheduler's pods, called with hcs-scheduler's certificate only.
    (profile,) = scheduler_config()["profiles"]
    assert args.scheduler_name == [profile["schedulerName"]] == [SCHEDULER]
    assert args.allowed_client == [SCHEDULER]


def test_hcs_scheduler_runs_the_shipped_configuration_with_its_client_certificate() -> None:
    """The --config file is the ConfigMap's config.yaml; tlsConfig's files are in the Secret
    mounted where it names them; it runs as upstream's image, not ours."""
    pod = pod_spec("Deployment", SCHEDULER)
    (container,) = pod["containers"]
    assert container["image"].startswith("registry.k8s.io/kube-scheduler:v")
    assert pod["serviceAccountName"] == SCHEDULER
    (config_flag,) = [a for a in container["command"] if a.startswith("--config=")]
    config_path = Path(config_flag.removeprefix("--config="))
    config_volume = mounts(pod)[str(config_path.parent)]
    assert config_volume["configMap"]["name"] == f"{SCHEDULER}-config"
    assert config_path.name == "config.yaml"
    (extender,) = scheduler_config()["extenders"]
    tls_dirs = {str(Path(path).parent) for path in extender["tlsConfig"].values()}
    (tls_dir,) = tls_dirs
    assert mounts(pod)[tls_dir]["secret"]["secretName"] == "hcs-scheduler-client-tls"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_network_policy_lets_each_port_be_reached_only_by_its_clients() -> None:
    (policy,) = by_kind("NetworkPolicy").values()
    labels = by_kind("Deployment")[names.EXTENDER_ACCOUNT]["spec"]["template"]["metadata"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels["labels"].items()
    rules = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["spec"]["ingress"]}
    assert PROBE_PORT in rules and names.EXTENDER_PORT in rules
    (source,) = rules[names.EXTENDER_PORT]  # hcs-scheduler's pods, and no one else
    assert source == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": SCHEDULER}}}
    # The probe port: the nodes (the kubelet) and one namespace (Prometheus), not everyone.
    nodes, monitoring = rules[PROBE_PORT]
    assert set(nodes) == {"ipBlock"} and set(monitoring) == {"namespaceSelector"}
    assert monitoring["namespaceSelector"]["matchLabels"]
    # The node-keys port: the DaemonSet's syncer pods, and the node addresses of syncers
    # run by hcs-syncer.service (host processes, which no pod selector matches).
    pods, hosts = rules[8890]
    assert pods["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "hcs-syncer"}
    assert set(hosts) == {"ipBlock"}


def test_the_assignment_policy_covers_the_subresources_that_write_metadata() -> None:
    """pods/status can change annotations; pods/* would include pods/binding, which is how
    the extender writes the annotation, and refuse every bind."""
    policy = by_kind("ValidatingAdmissionPolicy")["hcs-assignment-annotation"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    resources = set(rule["resources"])
    assert {"pods", "pods/status", "pods/ephemeralcontainers", "pods/resize"} <= resources
    assert not resources & {"pods/binding", "pods/*", "*"}


# --- kube-scheduler's configuration ---------------------------------------------------------


def test_scheduler_configuration_names_our_verbs_and_resources() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"])
    assert verbs == (names.FILTER_VERB, names.PRIORITIZE_VERB, names.BIND_VERB)
    assert extender["nodeCacheCapable"] is True  # the extender answers with node names only
    assert extender["ignorable"] is False  # never bind ai.compute/* pods unchecked
    managed = [(r["name"], r["ignoredByScheduler"]) for r in extender["managedResources"]]
    assert managed == [(resource, True) for resource in names.MANAGED_RESOURCES]


def test_the_controllers_compute_node_policy_names_every_status_field_but_fleet() -> None:
    """admission-controller.yaml compares each status field of the CRD but `fleet`: a field
    added to the CRD and not to the policy would be open to the controller."""
    (crd,) = [d for d in yaml.safe_load_all((ROOT / "crds" / "computenodes.yaml").read_text()) if d]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = set(schema["properties"]["status"]["properties"]) - {"fleet"}
    (policy,) = [
        d
        for d in yaml.safe_load_all((ROOT / "admission-controller.yaml").read_text())
        if d
        and d["metadata"]["name"] == "hcs-controller-computenode-status"
        and d["kind"] == "ValidatingAdmissionPolicy"
    ]
    expression = " ".join(v["expression"] for v in policy["spec"]["validations"])
    named = set(re.findall(r"object\.status\.\?(\w+) == oldObject\.status\.\?\1", expression))
    assert named == fields


def test_the_controllers_events_policy_allows_exactly_the_reasons_it_writes() -> None:
    """admission-controller.yaml lists the Events' reasons by the object they are about; the
    controller's tables (healer_actions) are what it writes: the two must be the same."""
    (policy,) = [
        d
        for d in yaml.safe_load_all((ROOT / "admission-controller.yaml").read_text())
        if d and d["metadata"]["name"] == "hcs-controller-events"
        and d["kind"] == "ValidatingAdmissionPolicy"
    ]  # fmt: skip
    expression = " ".join(v["expression"] for v in policy["spec"]["validations"])
    pod, node = expression.split("||")
    assert "'Pod'" in pod and "'ComputeNode'" in node
    for part, table in ((pod, POD_EVENTS), (node, COMPUTE_NODE_EVENTS)):
        (listed,) = re.findall(r"in\s*\[([^\]]*)\]", part)
        assert set(re.findall(r"'(\w+)'", listed)) == table


def test_the_measured_figures_bounds_are_the_syncers() -> None:
    """crds/computenodes.yaml bounds spec.devices[].measured; the syncer leaves out a figure
    past them (objects.MEASURED_BOUNDS) rather than have the whole spec refused."""
    (crd,) = [d for d in yaml.safe_load_all((ROOT / "crds" / "computenodes.yaml").read_text()) if d]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    device = schema["properties"]["spec"]["properties"]["devices"]["items"]
    measured = device["properties"]["measured"]["properties"]
    bounds = {
        name: (field["minimum"], field["maximum"])
        for name, field in measured.items()
        if field["type"] == "number"
    }
    assert bounds == MEASURED_BOUNDS
