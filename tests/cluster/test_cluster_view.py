"""`hcsctl cluster`, `kubectl hcs cluster` and `kubectl get computenodes` against the real
API server: ComputeNodes written by real hcs-syncers from hcsd on the simulated nodes of
conftest.NODES, a pod refused by the extender through the real kube-scheduler, a ComputeQuota
whose status the extender writes; then the errors a person meets (a restricted user, an API
server that does not answer, the CRD not installed). The tests run in order in one cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import KubeError
from tests.cluster.conftest import NPU_FAULT, Cluster, GiB, unschedulable_message
from tests.cluster.controlplane import free_port, request_token, token_kubeconfig
from tests.cluster.test_install import find_kubectl

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
NAMESPACE = "team-view"


def hcsctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hcsd.cli.hcsctl", *args],
        capture_output=True, text=True, check=False, env=env, timeout=60,
    )  # fmt: skip


def view(cluster: Cluster) -> dict[str, Any]:
    done = hcsctl("cluster", "--json", "--kubeconfig", str(cluster.plane.config_for("admin")))
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def account_kubeconfig(cluster: Cluster, name: str, rules: list[dict[str, Any]] | None) -> str:
    """A service account of NAMESPACE with the ClusterRole hcs-viewer and the Role hcs-viewer
    in hcs-system (rules None), a ClusterRole of its own with `rules`, or nothing bound
    (rules [])."""
    kube = cluster.kube
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", account)
    role = "hcs-viewer"
    if rules:
        role = f"test-{name}"
        kube.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role}, "rules": rules,
        })  # fmt: skip
    if rules is None or rules:
        kube.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"test-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        })  # fmt: skip
    if rules is None:
        bind(cluster, name, "Role", "hcs-viewer", "hcs-system")
    token = request_token(kube, name, namespace=NAMESPACE)
    path = cluster.work / f"{name}.kubeconfig"
    return str(token_kubeconfig(path, cluster.plane.server, cluster.work / "certs", token))


def bind(cluster: Cluster, account: str, kind: str, role: str, namespace: str) -> None:
    """A RoleBinding in `namespace` of `role` (a Role or a ClusterRole) to NAMESPACE's
    `account`."""
    cluster.kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"test-{account}-{role}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    })  # fmt: skip


def start_container(cluster: Cluster, pod: dict[str, Any]) -> None:
    """What containerd's NRI call does when the pod's container starts: its node's hcsd
    takes the grants of the signed assignment (the syncer then writes them to the status)."""
    node, meta = pod["spec"]["nodeName"], pod["metadata"]
    request = pb.PrepareContainerRequest(
        container_id=f"c-{meta['name']}", container_name="main",
        pod=pb.PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        pod_annotations=meta["annotations"],
    )  # fmt: skip
    with Client(cluster.daemons[node].socket) as hcsd:
        assert hcsd.prepare_container(request).allocation.source == "assignment"


def test_setup_a_held_slice_a_refused_pod_and_a_quota(cluster: Cluster) -> None:
    kube = cluster.kube
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": NAMESPACE}})  # fmt: skip
    kube.create(f"/apis/hcs.io/v1alpha1/namespaces/{NAMESPACE}/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": NAMESPACE},
        "spec": {"hard": {"vram": "1Ti", "devices": 4}},  # room: too-big meets the nodes
    })  # fmt: skip
    time.sleep(0.5)  # the extender's quota informer
    # A 16Gi slice of an A100 and a whole MLU370, their containers started on their nodes
    for name, resources, vendor, node in (
        ("held", {"ai.compute/vram": "16Gi"}, "nvidia", "gpu-node"),
        ("whole", {"ai.compute/devices": "1"}, "cambricon", "mlu-node"),
    ):
        cluster.create_pod(name, namespace=NAMESPACE, resources=resources,
                           annotations={"hcs.io/vendors": vendor})  # fmt: skip
        pod = cluster.wait_pod(name, namespace=NAMESPACE)
        assert pod["spec"].get("nodeName") == node, unschedulable_message(pod)
        start_container(cluster, pod)
    cluster.create_pod("too-big", namespace=NAMESPACE, resources={"ai.compute/vram": "500Gi"})
    refused = cluster.wait_pod("too-big", namespace=NAMESPACE)
    assert not refused["spec"].get("nodeName")


def wait_view(cluster: Cluster, ready: Any, timeout: float = 30) -> dict[str, Any]:
    """The view once `ready(view)` holds (the syncer and the extender write within seconds)."""
    deadline = time.monotonic() + timeout
    data = view(cluster)
    while not ready(data) and time.monotonic() < deadline:
        time.sleep(0.5)
        data = view(cluster)
    return data


def test_json_carries_the_figures(cluster: Cluster) -> None:
    def ready(data: dict[str, Any]) -> bool:
        used = {m["vendor"]: m["vram_used_bytes"] for m in data["models"]}
        quotas = [q["used"] for q in data["quotas"]]
        return bool(used["nvidia"] and used["cambricon"] and quotas and quotas[0])

    data = wait_view(cluster, ready)
    assert data["version"] == 1
    assert data["nodes"] == {"dcu-node": "Ready", "gpu-node": "Ready", "mlu-node": "Ready",
                             "npu-node": "Degraded"}  # fmt: skip
    models = {(m["vendor"], m["model"]): m for m in data["models"]}
    a100 = models[("nvidia", "A100-SXM4-80GB")]
    assert (a100["nodes"], a100["devices"], a100["not_healthy"]) == (["gpu-node"], 2, 0)
    assert (a100["vram_total_bytes"], a100["vram_used_bytes"]) == (160 * GiB, 16 * GiB)
    # 1 ACU = 3.12 TFLOPS: an A100 is 100; a 16Gi slice reserves no compute share
    assert (a100["acu_total"], a100["acu_used"], a100["acu_source"]) == (200.0, 0.0, "profile")
    npu = models[("ascend", "Ascend910B3")]
    assert (npu["devices"], npu["not_healthy"], npu["acu_total"]) == (2, 1, 200.6)
    # the unhealthy one is in the totals, not in free (the scheduler does not use it)
    assert (npu["unusable_devices"], npu["unusable_vram_bytes"]) == (1, 64 * GiB)
    assert (npu["vram_free_bytes"], npu["acu_free"]) == (64 * GiB, 100.3)
    # every syncer renews its heartbeat: no node is stale
    assert (data["heartbeats_checked"], data["stale_nodes"]) == (True, [])
    mlu = models[("cambricon", "MLU370-X8")]
    assert (mlu["acu_total"], mlu["acu_source"], mlu["measured_devices"]) == (
        123.2, "measured 1/4", 1,
    )  # fmt: skip
    # a whole device reserves all of it: 96 TFLOPS, 30.8 ACU
    assert (mlu["acu_used"], mlu["vram_used_bytes"]) == (30.8, 48 * GiB)
    assert models[("hygon", "Z100")]["acu_total"] == 7.9
    assert data["totals"]["devices"] == 9
    assert data["not_healthy_devices"] == [{
        "node": "npu-node", "uuid": "NPU-0000-0000-0000-000000000000", "vendor": "ascend",
        "index": 0, "model": "Ascend910B3", "health": "unhealthy", "health_score": 20,
        "reason": NPU_FAULT,
    }]  # fmt: skip
    waiting = {p["name"]: p for p in data["pending_pods"] if p["namespace"] == NAMESPACE}
    assert sorted(waiting) == ["held", "too-big", "whole"]
    # bound, its container not started by a kubelet (there is none here): Pending, with its node
    assert (waiting["held"]["node"], waiting["held"]["reason"]) == ("gpu-node", "Bound")
    pending = waiting["too-big"]
    assert pending["node"] == ""
    pod = cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/too-big")
    assert (pending["name"], pending["asks"]) == ("too-big", {"ai.compute/vram": "500Gi"})
    assert pending["reason"] == "Unschedulable"
    # kube-scheduler's message, with the extender's refusal for each node in it
    assert pending["message"] == unschedulable_message(pod) and "500Gi" in pending["message"]
    (quota,) = [q for q in data["quotas"] if q["namespace"] == NAMESPACE]
    assert quota["hard"] == {"vram": "1Ti", "devices": "4"}
    assert quota["used"] == {"vram": "64Gi", "tflops-fp16": "96", "devices": "2"}


def test_kubectl_hcs_runs_the_plugin_from_path(cluster: Cluster) -> None:
    kubectl = find_kubectl(cluster.plane)
    assert kubectl is not None, "no kubectl (built with the kubelet cluster's peers, or on PATH)"
    assert (BIN / "kubectl-hcs").exists(), "kubectl-hcs is a console script: pip install -e ."
    env = {**os.environ, "PATH": f"{BIN}:/usr/bin:/bin",
           "KUBECONFIG": str(cluster.plane.config_for("admin"))}  # fmt: skip
    plugins = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True,
                             env=env, check=False)  # fmt: skip
    assert str(BIN / "kubectl-hcs") in plugins.stdout, plugins.stdout + plugins.stderr
    done = subprocess.run([kubectl, "hcs", "cluster"], capture_output=True, text=True, env=env,
                          check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # with -s: the table as a person sees it
    lines = done.stdout.splitlines()
    assert lines[0] == f"cluster:  {cluster.plane.server}"
    assert (
        "devices:  9 (1 not healthy, 1 unusable: 64Gi VRAM and 100.3 ACU in the totals, "
        "not in free)" in lines
    )
    row = next(line for line in lines if line.startswith("nvidia"))
    assert row.split() == [
        "nvidia", "A100-SXM4-80GB", "1", "2", "0", "0", "16Gi/160Gi", "144Gi", "0/200", "profile",
    ]  # fmt: skip
    npu = next(line for line in lines if line.startswith("ascend"))
    assert npu.split()[4:8] == ["1", "1", "0/128Gi", "64Gi"]
    sick = next(line for line in lines if line.startswith("npu-node"))
    assert sick.split()[:5] == ["npu-node", "ascend/0", "Ascend910B3", "unhealthy", "20"]
    assert sick.endswith(NPU_FAULT)
    pod = next(line for line in lines if line.startswith(f"{NAMESPACE}  too-big"))
    assert "ai.compute/vram=500Gi" in pod and "Unschedulable: 0/" in pod
    assert any(line.startswith(f"{NAMESPACE}  limits  64Gi/1Ti") for line in lines), lines
    # `kubectl hcs` alone is the cluster view; --json after it, as hcsctl takes it
    alone = subprocess.run([kubectl, "hcs", "--json"], capture_output=True, text=True, env=env,
                           check=False, timeout=60)  # fmt: skip
    assert alone.returncode == 0 and json.loads(alone.stdout)["totals"]["devices"] == 9


def test_kubectl_get_computenodes_shows_the_columns(cluster: Cluster) -> None:
    kubectl = find_kubectl(cluster.plane)
    assert kubectl is not None
    admin = str(cluster.plane.config_for("admin"))
    done = subprocess.run([kubectl, "--kubeconfig", admin, "get", "computenodes"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "VENDOR", "DEVICES", "UNHEALTHY", "ACU-USED", "ACU-TOTAL", "VRAM-USED",
        "VRAM-TOTAL", "PHASE", "AGE",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:-1] for line in lines[1:]}
    assert rows["gpu-node"] == ["nvidia", "2", "0", "0", "200", "16Gi", "160Gi", "Ready"]
    assert rows["npu-node"] == ["ascend", "2", "1", "0", "200.6", "0", "128Gi", "Degraded"]
    assert rows["mlu-node"] == ["cambricon", "4", "0", "30.8", "123.2", "48Gi", "192Gi", "Ready"]
    quotas = subprocess.run([kubectl, "--kubeconfig", admin, "get", "computequotas", "-n",
                             NAMESPACE], capture_output=True, text=True, check=True)  # fmt: skip
    header, row = quotas.stdout.splitlines()
    assert header.split() == [
        "NAME", "VRAM-USED", "VRAM-HARD", "TFLOPS-USED", "TFLOPS-HARD", "DEVICES-USED",
        "DEVICES-HARD", "AGE",
    ]  # fmt: skip
    # kubectl leaves the cell of an unset field blank: cut the row at the header's columns
    starts = [header.index(name) for name in header.split()]
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    assert cells[:7] == ["limits", "64Gi", "1Ti", "96", "", "2", "4"]


def test_a_viewer_reads_it_and_others_are_told_which_verb_they_lack(cluster: Cluster) -> None:
    viewer = account_kubeconfig(cluster, "viewer", None)
    done = hcsctl("cluster", "--kubeconfig", viewer)
    assert done.returncode == 0, done.stderr
    assert "devices:  9 (1 not healthy, 1 unusable" in done.stdout
    assert "stale:" not in done.stdout  # the heartbeats were read, and all are live
    # hcs-viewer does not list pods (that exposes every pod's spec): the rest is shown
    assert (
        "pending accelerator pods: not shown (cannot list pods in all namespaces; "
        "the ClusterRole hcs-viewer-pods grants it)"
    ) in done.stdout, done.stdout
    # hcs-viewer-pods bound in one namespace: -n shows that namespace's pods
    bind(cluster, "viewer", "ClusterRole", "hcs-viewer-pods", NAMESPACE)
    one = hcsctl("cluster", "--json", "-n", NAMESPACE, "--kubeconfig", viewer)
    assert one.returncode == 0, one.stderr
    data = json.loads(one.stdout)
    assert data["pending_pods_shown"] and data["pending_pods_namespace"] == NAMESPACE
    assert sorted(p["name"] for p in data["pending_pods"]) == ["held", "too-big", "whole"]
    everywhere = json.loads(hcsctl("cluster", "--json", "-A", "--kubeconfig", viewer).stdout)
    assert not everywhere["pending_pods_shown"] and everywhere["pending_pods"] == []
    nobody = account_kubeconfig(cluster, "nobody", [])
    refused = hcsctl("cluster", "--kubeconfig", nobody)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(
        "hcsctl: forbidden: RBAC does not let you list computenodes.hcs.io (cluster-scoped); "
        "the ClusterRole hcs-viewer grants what this view reads"
    ), refused.stderr
    nodes_only = account_kubeconfig(cluster, "nodes-only", [
        {"apiGroups": ["hcs.io"], "resources": ["computenodes", "computequotas"],
         "verbs": ["list"]},
    ])  # fmt: skip
    partial = hcsctl("cluster", "--kubeconfig", nodes_only)
    assert partial.returncode == 0, partial.stderr
    assert "devices:  9 (1 not healthy, 1 unusable" in partial.stdout
    assert (
        "stale:    not checked (cannot list leases.coordination.k8s.io in hcs-system (the "
        "nodes' heartbeats); the Role hcs-viewer in hcs-system grants it)"
    ) in partial.stdout, partial.stdout
    assert "pending accelerator pods: not shown (cannot list pods" in partial.stdout


def test_credentials_the_api_server_does_not_take_are_not_rbac_advice(
    cluster: Cluster, tmp_path: Path
) -> None:
    """No credentials (the API server takes the request as system:anonymous: what a failed
    exec plugin leaves) and a token it refuses (401): "not authenticated", not a role."""
    admin = yaml.safe_load(cluster.plane.config_for("admin").read_text())
    for user in admin["users"]:
        user["user"] = {}
    anonymous = tmp_path / "anonymous.kubeconfig"
    anonymous.write_text(yaml.safe_dump(admin))
    for user in admin["users"]:
        user["user"] = {"token": "not-a-token"}
    refused = tmp_path / "refused.kubeconfig"
    refused.write_text(yaml.safe_dump(admin))
    for user in admin["users"]:  # an exec credential plugin that fails
        user["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                 "command": "false", "interactiveMode": "Never"}}  # fmt: skip
    plugin = tmp_path / "plugin.kubeconfig"
    plugin.write_text(yaml.safe_dump(admin))
    for path in (anonymous, refused, plugin):
        done = hcsctl("cluster", "--kubeconfig", str(path))
        assert done.returncode == 1
        *above, said = done.stderr.splitlines()
        if path == plugin:  # the client's own line on the plugin, then ours
            assert above == ["ERROR:root:exec: process returned 1"], done.stderr
        assert said.startswith(
            f"hcsctl: not authenticated to the API server at {cluster.plane.server} "
            "(the kubeconfig's credential plugin failed, see above, or its credentials were "
            "refused)"
        ), done.stderr
        assert "RBAC" not in done.stderr and "--user" not in done.stderr


def test_a_node_whose_heartbeat_stopped_is_stale(cluster: Cluster) -> None:
    """Its syncer killed and its Lease deleted: the extender no longer schedules to it, and
    the view counts it apart; its syncer back, it counts again."""
    cluster.kill_syncer("mlu-node")
    try:
        cluster.kube.request(
            "DELETE", "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/hcs-node-mlu-node"
        )
        data = view(cluster)
        assert data["nodes"]["mlu-node"] == "stale"
        (stale,) = data["stale_nodes"]
        assert stale["node"] == "mlu-node" and "no hcs heartbeat Lease" in stale["reason"]
        assert (stale["devices"], stale["vram_total_bytes"]) == (4, 192 * GiB)
        assert data["totals"]["devices"] == 5 and data["stale_totals"]["devices"] == 4
        assert "cambricon" not in {m["vendor"] for m in data["models"]}
        text = hcsctl("cluster", "--kubeconfig", str(cluster.plane.config_for("admin"))).stdout
        assert "stale:    1 nodes, 4 devices, 192Gi VRAM, 123.2 ACU: not counted above" in text
        assert "mlu-node  4        192Gi  123.2  no hcs heartbeat Lease" in text, text
    finally:
        cluster.start_syncer("mlu-node")
    live = wait_view(cluster, lambda d: not d["stale_nodes"])
    assert live["totals"]["devices"] == 9


def test_an_api_server_that_does_not_answer(cluster: Cluster, tmp_path: Path) -> None:
    config = (cluster.plane.config_for("admin")).read_text()
    port = free_port()  # nothing listens there
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(config.replace(cluster.plane.server, f"https://127.0.0.1:{port}"))
    started = time.monotonic()
    done = hcsctl("cluster", "--kubeconfig", str(dead), "--timeout", "3")
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert done.stderr.startswith(
        f"hcsctl: cannot reach the API server at https://127.0.0.1:{port}: "
    ), done.stderr
    missing = hcsctl("cluster", env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
    assert missing.returncode == 1
    assert missing.stderr.startswith("hcsctl: no kubeconfig: give --kubeconfig"), missing.stderr
    context = hcsctl("cluster", "--kubeconfig", str(cluster.plane.config_for("admin")),
                     "--context", "elsewhere")  # fmt: skip
    assert context.returncode == 1 and "elsewhere" in context.stderr, context.stderr


def test_without_the_crd_it_says_so(cluster: Cluster) -> None:
    """Last: the ComputeNode CRD is removed from this module's cluster."""
    for name, node in (("held", "gpu-node"), ("whole", "mlu-node")):
        with Client(cluster.daemons[node].socket) as hcsd:
            hcsd.container_gone(pb.ContainerGoneRequest(container_id=f"c-{name}", deleted=True))
        cluster.delete_pod(name, NAMESPACE)
    cluster.delete_pod("too-big", NAMESPACE)
    try:
        cluster.kube.request(
            "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/computenodes.hcs.io"
        )
    except KubeError as e:
        pytest.fail(f"could not delete the CRD: {e}")
    admin = str(cluster.plane.config_for("admin"))
    deadline = time.monotonic() + 60
    done = hcsctl("cluster", "--kubeconfig", admin)
    while "is not installed" not in done.stderr and time.monotonic() < deadline:
        time.sleep(1)  # the CRD's objects are deleted first, then it stops being served
        done = hcsctl("cluster", "--kubeconfig", admin)
    assert done.returncode == 1
    assert done.stderr == (
        "hcsctl: the ComputeNode CRD (computenodes.hcs.io) is not installed in the cluster at "
        f"{cluster.plane.server}: kubectl apply -k /usr/share/hcsd/kubernetes "
        "(docs/cluster.md, Install)\n"
    )
