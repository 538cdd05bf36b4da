"""docs/install.md's cluster steps on real kubelets: `helm install` of the chart onto the bare
kubelet cluster, so that the syncers, the extender, the webhook, hcs-scheduler and
hcs-controller run as pods from their images; the first pod (no schedulerName) gets
hcs-scheduler from the webhook, is placed by the hcs-scheduler pod through the extender pod
and runs on the NVIDIA node with its quota enforced inside; then `helm upgrade` with a
changed value and `helm uninstall`.

The images: HCS's (`cluster_image`, `make image`) and hcs-scheduler's
registry.k8s.io/kube-scheduler:v1.36.3, written here from the statically linked
kube-scheduler of the peers' build (no registry serves it: tests/harness/images.py), both
imported into the nodes' containerd. The doc's blocks run as written but for the
substitutions docs/install.md lists: the registry, the extra values below (no kube-proxy,
no cluster DNS, no network plugin, both nodes on one host's network), the first pod's image
and its host network.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.kube import KubeError
from tests.cluster.controlplane import free_port
from tests.harness import install_doc
from tests.harness.images import SCHEDULER_IMAGE, ClusterImage, scheduler_image
from tests.harness.kubecluster import pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.peers.helm import ensure_helm
from tests.harness.waiting import wait_for
from tests.kubelet.test_demo import demo_script
from tests.runtime.image import BUSYBOX_IMAGE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "hcs-system"
RELEASE_PODS = (
    "hcs-syncer",
    "hcs-scheduler-extender",
    "hcs-admission-webhook",
    "hcs-scheduler",
    "hcs-controller",
)
# docs/install.md's substitutions (it lists them).
REGISTRY = ("registry.example.com/hcs", "docker.io/hcs")
POD_IMAGE = ("docker.io/library/busybox:1.37", BUSYBOX_IMAGE)
POD_NETWORK = (
    "spec:\n  restartPolicy: Never",
    "spec:\n  hostNetwork: true\n  restartPolicy: Never",
)


def environment_values(cluster: KubeletCluster) -> dict[str, Any]:
    """What this cluster needs beyond the doc's install (docs/helm.md, "Clusters without
    kube-proxy"): pods on the host's network, the API server's own address, the extender
    called at the node address with free ports (other tests run on this host), and one
    replica each (the two nodes share the host's network: two would bind the same ports)."""
    api = cluster.api_env()
    return {
        "hostNetwork": True,
        "kubernetesAPI": {"host": api["KUBERNETES_SERVICE_HOST"],
                          "port": api["KUBERNETES_SERVICE_PORT"]},
        "extenderAddress": cluster.peers.address,
        "ports": {k: free_port() for k in ("extender", "extenderProbes", "extenderNodeKeys",
                                            "webhook", "scheduler", "controllerProbes")},
        "extender": {"replicas": 1}, "scheduler": {"replicas": 1}, "webhook": {"replicas": 1},
        "controller": {"replicas": 1},
    }  # fmt: skip


def doc_steps(values: Path) -> list[str]:
    """docs/install.md's cluster blocks with its documented substitutions, each applied
    exactly once where the doc has it (a doc that drifts fails here, not later)."""
    steps = []
    for block in install_doc.blocks("cluster"):
        step = block
        for old, new in (REGISTRY, POD_IMAGE, POD_NETWORK):
            step = step.replace(old, new)
        if "\nhelm install " in f"\n{step}":  # the block's last command
            step = step.rstrip("\n") + f" --values {values}\n"
        steps.append(step)
    script = "".join(steps)
    assert script.count(f"--values {values}") == 1 and script.count(BUSYBOX_IMAGE) == 1, script
    assert "hostNetwork: true" in script and REGISTRY[0] not in script, script
    return steps


def run_step(cluster: KubeletCluster, helm: Path, step: str) -> tuple[str, float]:
    """One block under bash -e, as an operator's shell with helm, kubectl, hcsctl and
    kubectl-hcs on PATH and the admin kubeconfig; its output and seconds."""
    path = os.pathsep.join([str(helm.parent), str(cluster.peers.node), str(REPO / ".venv/bin"),
                            os.environ.get("PATH", "")])  # fmt: skip
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(cluster.control.config_for("admin"))}
    started = time.monotonic()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=420, check=False)  # fmt: skip
    seconds = time.monotonic() - started
    out = done.stdout + done.stderr
    print(f"$ {step.strip()}\n{out}({seconds:.1f} s)")
    assert done.returncode == 0, f"{step}\nexited {done.returncode}:\n{out}"
    return out, seconds


def release_pods(cluster: KubeletCluster) -> list[dict[str, Any]]:
    return list(cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods").get("items", []))


def all_ready(cluster: KubeletCluster) -> bool:
    """One pod of each program per replica/node, every one Ready."""
    listed = release_pods(cluster)
    names = [p["metadata"]["labels"].get("app.kubernetes.io/name") for p in listed]
    wanted = {**dict.fromkeys(RELEASE_PODS, 1), "hcs-syncer": len(cluster.nodes)}
    return {n: names.count(n) for n in RELEASE_PODS} == wanted and all(
        any(c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions") or [])
        for p in listed
    )  # fmt: skip


def secret_data(cluster: KubeletCluster, name: str) -> dict[str, str]:
    return dict(cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")["data"])


@pytest.fixture(scope="module")
def helm() -> Path:
    found = ensure_helm()
    if isinstance(found, str):
        pytest.skip(f"SKIP helm install on kubelets: {found}")
    return Path(found)


def test_the_install_doc_on_real_kubelets_then_upgrade_and_uninstall(
    stamped_bare_kubelet_cluster: KubeletCluster, cluster_image: ClusterImage, helm: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    cluster = stamped_bare_kubelet_cluster
    cluster.import_image(cluster_image.path)
    cluster.import_image(scheduler_image(cluster.peers.control / "kube-scheduler", tmp_path))
    values = tmp_path / "test-environment.yaml"
    values.write_text(yaml.safe_dump(environment_values(cluster)))
    install, first_pod, view, delete_first = doc_steps(values)
    try:
        _, install_seconds = run_step(cluster, helm, install)  # --wait: every pod Ready
        assert all_ready(cluster), [p["status"] for p in release_pods(cluster)]
        for pod in release_pods(cluster):
            for status in pod["status"]["containerStatuses"]:
                assert status["restartCount"] == 0, status
        images = {c["image"] for p in release_pods(cluster) for c in p["spec"]["containers"]}
        assert images == {cluster_image.name, SCHEDULER_IMAGE}, images

        out, pod_seconds = run_step(cluster, helm, first_pod)
        pod = cluster.kube.get(pods.pod_path("first-pod"))
        node = cluster.nodes[pod["spec"]["nodeName"]]  # either: it names no vendor
        assert f"hcs-scheduler {node.name}" in out  # the webhook's scheduler
        assert "hcs.io/assignment" in pod["metadata"]["annotations"]
        assert f"device.0.vendor={node.vendor.vendor}" in out  # the quota file, in its log
        assert f"device.0.vram_limit={16 * 2**30}" in out, out
        running = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        print(f"first pod: created {pod['metadata']['creationTimestamp']}, running {running}")

        enforced_inside(cluster)
        out, _ = run_step(cluster, helm, view)
        view_json = json.loads(out[out.index("\n{") + 1 :])  # after hcsctl cluster's table
        assert "bare-gpu" in out and view_json, out
        run_step(cluster, helm, delete_first)
        print(f"TIMING helm install --wait (install to every pod Ready): {install_seconds:.1f} s;"
              f" first pod apply to Ready: {pod_seconds:.1f} s")  # fmt: skip

        upgrade_keeps_secrets_and_rolls_the_scheduler(cluster, helm)
        uninstall_leaves_what_the_doc_says(cluster, helm)
    finally:
        cleanup(cluster, helm)


def enforced_inside(cluster: KubeletCluster) -> None:
    """test_demo's pod (no schedulerName either) and its in-container checks of the quota:
    the second process is refused what the first holds of the 16Gi."""
    node = cluster.nodes["bare-gpu"]
    name = "helm-demo"
    pods.create(cluster.kube, pods.PodSpec(name, vendor="nvidia"))  # hcs.io/vendors
    try:
        pod = pods.wait_phase(cluster.kube, name, {"Running", "Failed"}, timeout=120)
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["spec"]["schedulerName"] == "hcs-scheduler"
        assert pod["spec"]["nodeName"] == node.name
        out = cluster.kubectl("exec", name, "--", "sh", "-c", demo_script(node), timeout=60)
        lines = out.splitlines()
        refused = f"refused (code {node.vendor.oom_code})"
        assert "preload=/usr/lib/hcs/libhcs.so" in lines, out
        assert [line for line in lines if line.startswith("second: ")] == [
            "second: libhcs mapped: yes",
            f"second: alloc 10240 MiB: {refused}",
            "second: alloc 6144 MiB: ok",
        ], out
    finally:
        pods.delete(cluster.kube, name, grace=0)
        wait_for(lambda: pods.get(cluster.kube, name) is None, "the demo pod is gone", timeout=60)


def upgrade_keeps_secrets_and_rolls_the_scheduler(cluster: KubeletCluster, helm: Path) -> None:
    """docs/helm.md: keys and certificates stay byte for byte; a changed configuration value
    (scheduler.verbosity) rolls hcs-scheduler's pod, which comes back Ready."""
    names = ("hcs-assignment-key", "hcs-scheduler-extender-tls", "hcs-scheduler-client-tls",
             "hcs-admission-webhook-tls")  # fmt: skip
    before = {n: secret_data(cluster, n) for n in names}
    old = {p["metadata"]["name"] for p in release_pods(cluster)
           if p["metadata"]["labels"]["app.kubernetes.io/name"] == "hcs-scheduler"}  # fmt: skip
    run_step(cluster, helm, "helm upgrade hcs packaging/helm/hcs --namespace hcs-system "
             "--reuse-values --set scheduler.verbosity=4 --wait --timeout 5m")  # fmt: skip
    assert {n: secret_data(cluster, n) for n in names} == before
    deployment = cluster.kube.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hcs-scheduler")
    assert "--v=4" in deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    wait_for(lambda: all_ready(cluster) and not old & {p["metadata"]["name"] for p in
             release_pods(cluster)}, "hcs-scheduler rolled and Ready", timeout=120)  # fmt: skip


def uninstall_leaves_what_the_doc_says(cluster: KubeletCluster, helm: Path) -> None:
    """docs/helm.md: every object of the release gone but the CRDs (and their objects) and
    the namespace (the operator made it)."""
    run_step(cluster, helm, "helm uninstall hcs --namespace hcs-system --wait --timeout 5m")
    wait_for(lambda: not release_pods(cluster), "the release's pods are gone", timeout=120)
    for path in (f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                 f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
                 f"/api/v1/namespaces/{NAMESPACE}/secrets",
                 f"/api/v1/namespaces/{NAMESPACE}/services"):  # fmt: skip
        assert not cluster.kube.get(path).get("items"), path
    with pytest.raises(KubeError):
        cluster.kube.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
                         "/hcs-scheduler-name")  # fmt: skip
    with pytest.raises(KubeError):
        cluster.kube.get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
                         "/hcs-scheduler-as-kube-scheduler")  # fmt: skip
    cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}")  # kept
    # What the programs wrote, not Helm: the leader and heartbeat Leases (docs/helm.md).
    leases = cluster.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")
    assert sorted(lease["metadata"]["name"] for lease in leases["items"]) == sorted(
        [
            "hcs-scheduler",
            "hcs-scheduler-extender",
            "hcs-controller",
            *(f"hcs-node-{n}" for n in cluster.nodes),
        ]
    )
    for crd in ("computenodes.hcs.io", "computequotas.hcs.io"):  # kept
        cluster.kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")


def cleanup(cluster: KubeletCluster, helm: Path) -> None:
    """Whatever a failure left: the release, the first pod, the namespace; its pods gone
    before the cluster stops."""
    with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
        run_step(cluster, helm, "helm uninstall hcs --namespace hcs-system --wait "
                 "--ignore-not-found")  # fmt: skip
    with contextlib.suppress(KubeError):
        pods.delete(cluster.kube, "first-pod", grace=0)
    wait_for(lambda: pods.get(cluster.kube, "first-pod") is None, "first-pod is gone", timeout=60)
    wait_for(lambda: not release_pods(cluster), "the release's pods are gone", timeout=120)
    with contextlib.suppress(KubeError):
        cluster.kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
