"""HCS's cluster side as the shipped manifests run it, from HCS's image (`make image`) on
real kubelets: the syncer DaemonSet of packaging/kubernetes publishing each node's
ComputeNode from the node's hcsd, then the extender Deployment too, placing a pod.

The cluster is bare (no HCS objects, no host-process syncers or extender): everything of
HCS's cluster side here is what these tests deploy. What they change in the shipped
workloads, and why, is in `syncer_daemonset` and `extender_deployment`: the host network and
the API server's address (no CNI, no kube-proxy, no DNS here), the extender's node-keys
address, and for the extender one replica on free ports. The image is the one the
manifests name."""

from __future__ import annotations

import base64
import contextlib
import copy
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from tests.cluster.controlplane import free_port, manifests
from tests.harness.images import ClusterImage
from tests.harness.kubecluster import hcs, pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

NAMESPACE = "hcs-system"
COMPUTENODES = "/apis/hcs.io/v1alpha1/computenodes"
DAEMONSET = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"


# The kustomize tree names a placeholder for HCS's image (HCS publishes none): replaced with
# the image `make image` built, as an operator's kustomize `images:` does (docs/helm.md).
PLACEHOLDER = "registry.example/hcs/hcs-cluster"


def shipped_image(container: dict[str, Any], image: str) -> None:
    name, _, tag = container["image"].rpartition(":")
    assert name == PLACEHOLDER and tag == image.rpartition(":")[2], container["image"]
    container["image"] = image


def syncer_daemonset(
    cluster: KubeletCluster, image: str, node_keys: int | None = None
) -> dict[str, Any]:
    """packaging/kubernetes/syncer-daemonset.yaml, with only what this host needs changed;
    `node_keys` is the extender's node-keys port (default: the host-process extender's)."""
    (shipped,) = manifests("syncer-daemonset.yaml")
    daemonset = copy.deepcopy(shipped)
    pod = daemonset["spec"]["template"]["spec"]
    pod["hostNetwork"] = True  # no CNI here: the pods share the host's network
    (container,) = pod["containers"]
    shipped_image(container, image)
    container["env"] += [{"name": k, "value": v} for k, v in cluster.api_env().items()]
    command = container["command"]
    url = command.index("--node-keys-url") + 1
    assert command[url].startswith("https://hcs-scheduler-extender.hcs-system.svc:8890/")
    port = cluster.extender.node_keys if node_keys is None else node_keys
    command[url] = f"https://127.0.0.1:{port}/node-keys"  # no DNS here
    return daemonset


def node_keys_ca(cluster: KubeletCluster) -> dict[str, Any]:
    """The ConfigMap the DaemonSet mounts: the CA of the extender's serving certificate."""
    ca = (cluster.control.work / "certs" / "ca.crt").read_text()
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "hcs-node-keys-ca", "namespace": NAMESPACE},
        "data": {"ca.crt": ca},
    }  # fmt: skip


def published(cluster: KubeletCluster) -> bool:
    """Every node's ComputeNode Ready and holding the cluster's signing key (fetched by the
    in-pod syncer from the extender and installed in the node's hcsd)."""
    items = cluster.kube.get(COMPUTENODES).get("items", [])
    status = {i["metadata"]["name"]: i.get("status") or {} for i in items}
    return all(
        status.get(name, {}).get("phase") == "Ready"
        and cluster.keys.signing in status.get(name, {}).get("assignmentKeys", [])
        for name in cluster.nodes
    )


def test_the_syncer_daemonset_runs_from_the_image_and_publishes_the_nodes(
    bare_kubelet_cluster: KubeletCluster, cluster_image: ClusterImage
) -> None:
    cluster = bare_kubelet_cluster
    cluster.import_image(cluster_image.path)
    with pytest.raises(KubeError) as absent:  # a bare cluster holds nothing of HCS
        cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}")
    assert absent.value.not_found
    cluster.control.apply([*hcs.cluster_objects(cluster.keys), node_keys_ca(cluster)])
    cluster.start_extender()
    cluster.kube.create(DAEMONSET, syncer_daemonset(cluster, cluster_image.name))
    try:
        wait_for(lambda: published(cluster), "the in-pod syncers publish both nodes", timeout=180)

        def syncer_pods() -> list[dict[str, Any]]:
            found = cluster.kube.get(
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                query=[("labelSelector", "app.kubernetes.io/name=hcs-syncer")],
            )["items"]
            return list(found)

        # kubelet reports Running on its next status sync, which may follow the syncer's writes
        wait_for(lambda: all(p["status"].get("phase") == "Running" for p in syncer_pods()),
                 "kubelet to report the syncer pods Running", timeout=30)  # fmt: skip
        pods = syncer_pods()
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(cluster.nodes)
        for pod in pods:
            assert pod["status"]["phase"] == "Running", pod["status"]
            (status,) = pod["status"]["containerStatuses"]
            assert status["image"] == cluster_image.name and status["restartCount"] == 0, status
            # the token the pod got from the ServiceAccount admission plugin, bound to it
            volumes = [v["name"] for v in pod["spec"]["volumes"]]
            assert any(v.startswith("kube-api-access-") for v in volumes), volumes
            logs = cluster.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"])
            print(f"{pod['spec']['nodeName']}: {logs.strip().splitlines()[-1:]}")
    finally:
        delete_workload(cluster, DAEMONSET, "hcs-syncer")
        cluster.control.stop_process("extender")
        for name in cluster.nodes:  # the next test's syncers must write them anew
            with contextlib.suppress(KubeError):
                cluster.kube.request("DELETE", f"{COMPUTENODES}/{name}")


def delete_workload(cluster: KubeletCluster, collection: str, name: str) -> None:
    """A DaemonSet or Deployment and its pods, gone before the next test or the cluster's
    stop."""
    with contextlib.suppress(KubeError):
        cluster.kube.request(
            "DELETE", f"{collection}/{name}", query=[("propagationPolicy", "Foreground")]
        )

    def pods_gone() -> bool:
        listed = cluster.kube.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            query=[("labelSelector", f"app.kubernetes.io/name={name}")],
        )
        return not listed.get("items")

    wait_for(pods_gone, f"the pods of {name} are gone", timeout=90)


def extender_deployment(
    cluster: KubeletCluster, image: str, ports: hcs.ExtenderPorts
) -> dict[str, Any]:
    """packaging/kubernetes/extender.yaml's Deployment with one replica (the two nodes share
    the host's network: two replicas would bind the same ports), on the host network, with
    free ports in place of 8888/8889/8890 (other tests run on this host), the API server's
    address, and the plane's kube-scheduler as the client allowed."""
    (shipped,) = [d for d in manifests("extender.yaml") if d["kind"] == "Deployment"]
    deployment = copy.deepcopy(shipped)
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    (container,) = pod["containers"]
    shipped_image(container, image)
    moved = {8888: ports.verbs, 8889: ports.probes, 8890: ports.node_keys}
    container["command"] = [
        next((f"0.0.0.0:{new}" for old, new in moved.items() if arg == f"0.0.0.0:{old}"), arg)
        for arg in container["command"]
    ]
    # kube-scheduler here is the plane's (client certificate CN system:kube-scheduler, the
    # default profile), not the chart's hcs-scheduler Deployment the shipped flags name.
    allowed = container["command"].index("--allowed-client") + 1
    container["command"][allowed] = "system:kube-scheduler"
    served = container["command"].index("--scheduler-name") + 1  # its default profile
    container["command"][served] = "default-scheduler"
    for port in container["ports"]:
        port["containerPort"] = moved[port["containerPort"]]
    for probe in ("readinessProbe", "livenessProbe"):
        container[probe]["httpGet"]["port"] = moved[container[probe]["httpGet"]["port"]]
    container["env"] += [{"name": k, "value": v} for k, v in cluster.api_env().items()]
    return deployment


def extender_tls(cluster: KubeletCluster) -> dict[str, Any]:
    """The operator's Secret hcs-scheduler-extender-tls (docs/cluster.md, Install): the
    plane's extender serving certificate (it names 127.0.0.1) and the CA of kube-scheduler's
    client certificate."""
    certs = cluster.control.work / "certs"
    files = {"tls.crt": "extender-serving.crt", "tls.key": "extender-serving.key",
             "client-ca.crt": "ca.crt"}  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "hcs-scheduler-extender-tls", "namespace": NAMESPACE},
        "data": {k: base64.b64encode((certs / f).read_bytes()).decode() for k, f in files.items()},
    }  # fmt: skip


def test_the_extender_and_the_syncers_run_from_the_image_and_place_a_pod(
    bare_kubelet_cluster: KubeletCluster, cluster_image: ClusterImage
) -> None:
    """All of HCS's cluster side from the image: the extender Deployment (leader, serving
    kube-scheduler and the node keys) and the syncer DaemonSet; kube-scheduler then calls
    the extender pod, which places a pod asking for ai.compute/vram on the NVIDIA node, whose
    hcsd accepts the assignment the extender pod signed."""
    cluster = bare_kubelet_cluster
    cluster.import_image(cluster_image.path)  # again: harmless, and the test stands alone
    cluster.control.apply([*hcs.cluster_objects(cluster.keys), node_keys_ca(cluster),
                           extender_tls(cluster)])  # fmt: skip
    ports = hcs.ExtenderPorts(free_port(), free_port())
    cluster.kube.create(DEPLOYMENTS, extender_deployment(cluster, cluster_image.name, ports))
    demo = "image-demo"
    try:
        wait_for(
            lambda: extender_ready(cluster), "the extender pod is Ready (leading)", timeout=120
        )
        cluster.kube.create(
            DAEMONSET, syncer_daemonset(cluster, cluster_image.name, ports.node_keys)
        )
        wait_for(lambda: published(cluster), "the in-pod syncers publish both nodes", timeout=180)
        cluster.control.stop_process("kube-scheduler")
        cluster.control.start_scheduler(hcs.extender_url(ports))
        pods.create(cluster.kube, pods.PodSpec(demo, vendor="nvidia"))
        pod = pods.wait_phase(cluster.kube, demo, {"Running", "Failed"}, timeout=120)
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["spec"]["nodeName"] == "bare-gpu"
        assert "hcs.io/assignment" in pod["metadata"]["annotations"]
    finally:
        pods.delete(cluster.kube, demo, grace=0)
        wait_for(lambda: pods.get(cluster.kube, demo) is None, "the demo pod is gone", timeout=60)
        delete_workload(cluster, DAEMONSET, "hcs-syncer")
        delete_workload(cluster, DEPLOYMENTS, "hcs-scheduler-extender")


def extender_ready(cluster: KubeletCluster) -> bool:
    listed = cluster.kube.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        query=[("labelSelector", "app.kubernetes.io/name=hcs-scheduler-extender")],
    )["items"]
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for p in listed
        for c in p.get("status", {}).get("conditions") or []
    )
