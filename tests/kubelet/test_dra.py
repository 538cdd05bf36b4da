"""DRA mode's node side on real kubelets: hcs-syncer serves kubelet's DRA plugin for
compute.hcs.io, kubelet registers it, kube-scheduler allocates a share of a device from a
ResourceSlice, kubelet calls NodePrepareResources, hcsd holds the claim and writes its CDI
spec, containerd injects it, and the container (non-root) finds its device nodes, env,
libhcs and its quota file, and the quota enforced.

The ResourceSlice and the DeviceClass are this test's own (the publisher and the classes of
DRA mode are other parts), under names no other part uses: a slice of its own pool for
`kube-gpu`'s `nvidia-0` and a class selecting the driver's devices.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.api.client import Client
from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract import dra, paths
from tests.harness.kubecluster import hcs, pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.kubecluster.pods import PodSpec
from tests.harness.waiting import wait_for
from tests.kubelet.test_demo import check_demo, demo_script

pytestmark = pytest.mark.slow

GiB = 2**30
NODE = "kube-gpu"
RESOURCE = "/apis/resource.k8s.io/v1"
CLASS = "hcs-test-node-side"
SLICE = f"{NODE}-hcs-test-node-side"
CLAIMS = f"{RESOURCE}/namespaces/{pods.NAMESPACE}/resourceclaims"
USER = 1000
CDI_DIR = "/run" + paths.CDI_DIR.removeprefix("/var/run")  # the directory the node makes private


def _delete(kube: Kube, path: str) -> None:
    try:
        kube.request("DELETE", path)
    except KubeError as e:
        if not e.not_found:
            raise


def resource_slice(node: KubeletNode, vram_bytes: int) -> dict[str, Any]:
    """One device, shareable: memory in 256Mi steps, compute in whole percent."""
    step = f"{dra.MEMORY_STEP_BYTES}"
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": SLICE},
        "spec": {
            "driver": dra.DRIVER, "nodeName": node.name,
            "pool": {"name": SLICE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{
                "name": f"{node.vendor.vendor}-0",
                "allowMultipleAllocations": True,
                "attributes": {
                    dra.ATTR_VENDOR: {"string": node.vendor.vendor},
                    dra.ATTR_UUID: {"string": node.vendor.uuid},
                    dra.ATTR_INDEX: {"int": 0},
                },
                "capacity": {
                    dra.CAPACITY_MEMORY: {"value": str(vram_bytes), "requestPolicy": {
                        "default": step, "validRange": {"min": step, "step": step}}},
                    dra.CAPACITY_COMPUTE: {"value": "100", "requestPolicy": {
                        "default": "100", "validRange": {"min": "1", "step": "1"}}},
                },
            }],
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def offered(kubelet_cluster: KubeletCluster) -> Iterator[KubeletNode]:
    """The DeviceClass and the ResourceSlice, once kubelet has registered the plugin."""
    cluster = kubelet_cluster
    node = cluster.nodes[NODE]
    syncer_log = node.dir / "syncer.log"
    wait_for(
        lambda: "kubelet registered the DRA plugin compute.hcs.io" in syncer_log.read_text(),
        "kubelet registered the DRA plugin",
        timeout=60,
    )
    with Client(str(node.host_path(paths.SOCKET))) as client:
        (device,) = client.devices()
    kube = cluster.kube
    kube.create(f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{dra.DRIVER}"'}}]},
    })  # fmt: skip
    kube.create(f"{RESOURCE}/resourceslices", resource_slice(node, device.vram_bytes))
    yield node
    _delete(kube, f"{RESOURCE}/resourceslices/{SLICE}")
    _delete(kube, f"{RESOURCE}/deviceclasses/{CLASS}")


def claim(name: str, memory: str, compute: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS,
            "capacity": {"requests": {dra.CAPACITY_MEMORY: memory,
                                      dra.CAPACITY_COMPUTE: compute}},
        }}]}},
    }  # fmt: skip


def claim_pod(name: str, claim_name: str, user: int | None) -> dict[str, Any]:
    """The demo pod, with the claim instead of `ai.compute/*` limits."""
    pod = pods.manifest(PodSpec(name, run_as_user=user))
    container = pod["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": dra.POD_CLAIM_NAME}]}
    pod["spec"]["resourceClaims"] = [{"name": dra.POD_CLAIM_NAME, "resourceClaimName": claim_name}]
    return pod


def test_kubelet_registered_the_plugin_and_containerd_reads_hcsds_cdi_dir(
    kubelet_cluster: KubeletCluster, offered: KubeletNode
) -> None:
    node = offered
    kubelet_log = (node.dir / "kubelet.log").read_text()
    lines = [line for line in kubelet_log.splitlines() if dra.DRIVER in line]
    print("kubelet on compute.hcs.io:\n" + "\n".join(lines[:10]))
    assert lines, "kubelet's log never names the driver"
    assert node.host_path("/var/lib/kubelet/plugins_registry/compute.hcs.io-reg.sock").exists()
    assert node.host_path("/var/lib/kubelet/plugins/compute.hcs.io/dra.sock").exists()
    crictl = node.containerd.crictl("info")
    assert '"enableCDI": true' in crictl, crictl[:2000]
    assert paths.CDI_DIR in crictl.split('"cdiSpecDirs"', 1)[1][:200], crictl[:2000]


def test_a_claimed_share_reaches_the_container(
    kubelet_cluster: KubeletCluster, offered: KubeletNode
) -> None:
    cluster, node, kube = kubelet_cluster, offered, kubelet_cluster.kube
    name = "dra-share"
    created = kube.create(CLAIMS, claim(name, "16Gi", "30"))
    uid = created["metadata"]["uid"]
    try:
        kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", claim_pod(name, name, USER))
        pod = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=90)
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["spec"]["nodeName"] == NODE
        allocated = kube.get(f"{CLAIMS}/{name}")["status"]["allocation"]["devices"]["results"]
        assert [(r["device"], r["consumedCapacity"]) for r in allocated] == [
            ("nvidia-0", {"memory": "16Gi", "compute": "30"})
        ]
        with Client(str(node.host_path(paths.SOCKET))) as client:
            held = {a.container_id: a for a in client.allocations()}
        grants = held[f"claim-{uid}"].grants
        assert [(g.device_uuid, g.vram_bytes, g.compute_percent) for g in grants] == [
            (node.vendor.uuid, 16 * GiB, 30)
        ]
        spec = node.host_path(f"{CDI_DIR}/compute.hcs.io-claim_{uid}.json")
        assert spec.is_file()

        out = cluster.kubectl("exec", name, "--", "sh", "-c", demo_script(node), timeout=60)
        print(f"--- {name} on {node.name}:\n{out}")
        quota = cluster.kubectl("exec", name, "--", "cat", "/run/hcs/quota.conf")
        print(quota)
        check_demo(out, node, USER)
        assert f"device.0.uuid={node.vendor.uuid}" in quota
        assert f"device.0.vram_limit={16 * GiB}" in quota
        assert "device.0.compute_percent=30" in quota
    finally:
        pods.delete(kube, name, grace=0)
    # kubelet unprepares once the pod is gone: hcsd releases the claim and removes its files
    started = time.monotonic()

    def released() -> bool:
        with Client(str(node.host_path(paths.SOCKET))) as client:
            return all(a.container_id != f"claim-{uid}" for a in client.allocations())

    wait_for(released, "hcsd released the claim", timeout=60)
    print(f"{name}: claim released {time.monotonic() - started:.2f} s after the pod's delete")
    assert not node.host_path(f"{CDI_DIR}/compute.hcs.io-claim_{uid}.json").exists()
    assert not node.host_path(f"{hcs.RUN_DIR}/claims/claim-{uid}").exists()
    _delete(kube, f"{CLAIMS}/{name}")


def respawn(node: KubeletNode, name: str, *, kill: bool) -> None:
    """Stop one of the node's processes this cluster started (SIGKILL or as it stops) and
    start it again with the same command."""
    process = node.processes[name]
    command = [str(a) for a in process.args][len(node.namespace.enter) :]  # type: ignore[union-attr]
    if kill:
        process.kill()
        process.wait()
        node.processes.pop(name)
    else:
        node.stop_process(name)
    node.spawn(name, command)


def registrations(node: KubeletNode) -> int:
    return (node.dir / "syncer.log").read_text().count("kubelet registered the DRA plugin")


def run_claim_pod(cluster: KubeletCluster, name: str, memory: str) -> tuple[str, dict[str, Any]]:
    """A claim of `memory` and 10% and a pod using it, Running; (claim uid, pod)."""
    kube = cluster.kube
    uid = kube.create(CLAIMS, claim(name, memory, "10"))["metadata"]["uid"]
    kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", claim_pod(name, name, None))
    pod = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=120)
    assert pod["status"]["phase"] == "Running", pod["status"]
    return uid, pod


def held_claims(node: KubeletNode) -> dict[str, Any]:
    with Client(str(node.host_path(paths.SOCKET))) as client:
        return {a.container_id: a for a in client.allocations() if a.source == "claim"}


def finish(cluster: KubeletCluster, node: KubeletNode, name: str, uid: str) -> None:
    pods.delete(cluster.kube, name, grace=0)
    wait_for(lambda: f"claim-{uid}" not in held_claims(node), "hcsd released the claim", timeout=60)
    _delete(cluster.kube, f"{CLAIMS}/{name}")


@pytest.mark.parametrize("delay", [0.0, 1.0], ids=["at-once", "after-1s"])
def test_kill_9_of_the_plugin_around_prepare(
    kubelet_cluster: KubeletCluster, offered: KubeletNode, delay: float
) -> None:
    """The syncer dies with kill -9 just after the pod is made (before, during or after
    kubelet's prepare: the test prints which); started again, it replaces its stale sockets,
    kubelet registers it again, and the pod runs with its claim held once."""
    node, name = offered, f"dra-kill-plugin-{int(delay)}"
    before = registrations(node)
    kube = kubelet_cluster.kube
    uid = kube.create(CLAIMS, claim(name, "8Gi", "10"))["metadata"]["uid"]
    kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", claim_pod(name, name, USER))
    time.sleep(delay)
    at_kill = "held" if f"claim-{uid}" in held_claims(node) else "not yet held"
    respawn(node, "syncer", kill=True)
    print(f"{name}: the syncer was killed with the claim {at_kill}")
    try:
        pod = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=120)
        assert pod["status"]["phase"] == "Running", pod["status"]
        wait_for(lambda: registrations(node) > before, "kubelet registered the new syncer")
        (grant,) = held_claims(node)[f"claim-{uid}"].grants
        assert (grant.vram_bytes, grant.compute_percent) == (8 * GiB, 10)
        quota = kubelet_cluster.kubectl("exec", name, "--", "cat", "/run/hcs/quota.conf")
        assert f"container=claim-{uid}" in quota
    finally:
        finish(kubelet_cluster, node, name, uid)


def test_kill_9_of_hcsd_before_prepare(
    kubelet_cluster: KubeletCluster, offered: KubeletNode
) -> None:
    """hcsd is down (kill -9) when kubelet prepares: the pod waits, kubelet retries, and
    once hcsd is back the pod runs; a claim prepared before the kill is still held."""
    node, kube = offered, kubelet_cluster.kube
    kept_uid, _ = run_claim_pod(kubelet_cluster, "dra-kept", "4Gi")
    assert node.hcsd is not None and node.hcsd.process is not None
    node.hcsd.process.kill()
    node.hcsd.process.wait()
    name = "dra-kill-hcsd"
    failures = (node.dir / "syncer.log").read_text().count("failed to prepare")
    uid = kube.create(CLAIMS, claim(name, "4Gi", "10"))["metadata"]["uid"]
    try:
        kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", claim_pod(name, name, None))
        wait_for(
            lambda: (node.dir / "syncer.log").read_text().count("failed to prepare") > failures,
            "kubelet's prepare failed while hcsd was down",
            timeout=60,
        )
        assert (pods.get(kube, name) or {})["status"].get("phase") == "Pending"
        node.hcsd.start()
        pod = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=180)
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert {f"claim-{uid}", f"claim-{kept_uid}"} <= set(held_claims(node))
    finally:
        finish(kubelet_cluster, node, name, uid)
        finish(kubelet_cluster, node, "dra-kept", kept_uid)


def test_kubelet_restart_registers_the_plugin_again(
    kubelet_cluster: KubeletCluster, offered: KubeletNode
) -> None:
    """A restarted kubelet finds the registration socket again; the running pod's claim is
    unprepared through the plugin when the pod goes."""
    node, name = offered, "dra-kubelet-restart"
    uid, _ = run_claim_pod(kubelet_cluster, name, "4Gi")
    before = registrations(node)
    respawn(node, "kubelet", kill=False)
    wait_for(lambda: registrations(node) > before, "the restarted kubelet registered the plugin",
             timeout=90)  # fmt: skip
    assert f"claim-{uid}" in held_claims(node)
    finish(kubelet_cluster, node, name, uid)
