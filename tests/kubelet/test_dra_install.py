"""DRA mode installed as a user installs it, on real kubelets: `helm install --set mode=dra`
of the shipped chart onto the bare cluster (hcsd on the nodes as the host daemon, the rest as
the chart's pods from HCS's image), then pods that write only `ai.compute/*` (no claim, no
schedulerName) through the whole path: the webhook's template, the syncers' slices, the
cluster's own kube-scheduler (untouched: no extender, no configuration), the syncer pod's
kubelet plugin, hcsd's PrepareClaim, the CDI spec, and the container.

One install for the module; each test deletes its pods. The environment's values are
test_helm_install's (host network, the API server's address, free ports, one replica).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.api.client import Client
from hcsd.cluster.dra_slices import slice_name
from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract import dra, paths
from tests.harness.images import ClusterImage, scheduler_image
from tests.harness.kubecluster import hcs, pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.fixture import (  # noqa: F401 - the module's cluster
    DRA_QUIET_PERIOD,
    dra_kubelet_cluster,
)
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.kubecluster.pods import PodSpec
from tests.harness.peers.helm import ensure_helm
from tests.harness.waiting import wait_for
from tests.kubelet.test_demo import check_demo, demo_script
from tests.kubelet.test_helm_install import environment_values, run_step
from tests.runtime.image import BUSYBOX_IMAGE

pytestmark = pytest.mark.slow

GiB = 2**30
GPU, NPU = "dra-gpu", "dra-npu"
USER = 1000
RESOURCE = "/apis/resource.k8s.io/v1"
TEMPLATES = f"{RESOURCE}/namespaces/{pods.NAMESPACE}/resourceclaimtemplates"
CLAIMS = f"{RESOURCE}/namespaces/{pods.NAMESPACE}/resourceclaims"
NAMESPACE = "hcs-system"


def held_claims(node: KubeletNode) -> dict[str, Any]:
    """hcsd's claim allocations on `node`, by ledger id (`claim-<uid>`)."""
    with Client(str(node.host_path(paths.SOCKET))) as client:
        return {a.container_id: a for a in client.allocations() if a.source == "claim"}


def slice_of(kube: Kube, node: str) -> dict[str, Any] | None:
    try:
        return kube.get(f"{RESOURCE}/resourceslices/{slice_name(node)}")
    except KubeError as e:
        if e.not_found:
            return None
        raise


def taints(kube: Kube, node: str) -> list[str]:
    found = slice_of(kube, node) or {"spec": {"devices": []}}
    return [f"{t['key']}={t['value']}:{t['effect']}"
            for d in found["spec"]["devices"] for t in d.get("taints") or ()]  # fmt: skip


def syncer_logs(cluster: KubeletCluster) -> str:
    return cluster.kubectl("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=hcs-syncer",
                           "--tail=-1", "--prefix", check=False)  # fmt: skip


@pytest.fixture(scope="module")
def installed(
    dra_kubelet_cluster: KubeletCluster,  # noqa: F811 - imported above
    cluster_image: ClusterImage,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KubeletCluster]:
    """The chart installed with `mode=dra` (docs/install.md's command, the environment's
    values), every pod Ready, both nodes' slices published and both plugins registered."""
    found = ensure_helm()
    if isinstance(found, str):
        pytest.skip(f"SKIP DRA install on kubelets: {found}")
    helm, cluster = Path(found), dra_kubelet_cluster
    work = tmp_path_factory.mktemp("dra-install")
    cluster.import_image(cluster_image.path)
    cluster.import_image(scheduler_image(cluster.peers.control / "kube-scheduler", work))
    values = work / "test-environment.yaml"
    values.write_text(yaml.safe_dump(environment_values(cluster)))
    repository = cluster_image.name.rsplit(":", 1)[0]
    started = time.monotonic()
    try:
        run_step(cluster, helm, f"""
kubectl create namespace {NAMESPACE}
kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged
helm install hcs packaging/helm/hcs --namespace {NAMESPACE} \\
    --set image.repository={repository} --set mode=dra --values {values} --wait --timeout 5m
""")  # fmt: skip
        for node in cluster.nodes:
            wait_for(lambda n=node: slice_of(cluster.kube, n) is not None,  # type: ignore[misc]
                     f"{node}'s ResourceSlice", timeout=60)  # fmt: skip
        wait_for(lambda: syncer_logs(cluster).count("kubelet registered the DRA plugin") >= 2,
                 "both kubelets registered the plugin", timeout=60)  # fmt: skip
        print(f"TIMING helm install --set mode=dra to slices and plugins: "
              f"{time.monotonic() - started:.1f} s")  # fmt: skip
        yield cluster
    finally:
        print(syncer_logs(cluster)[-6000:])
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            run_step(cluster, helm, f"helm uninstall hcs --namespace {NAMESPACE} --wait "
                     "--ignore-not-found --timeout 2m")  # fmt: skip
        wait_for(lambda: not cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"],
                 "the release's pods are gone", timeout=120)  # fmt: skip


def pod(
    name: str,
    limits: dict[str, str],
    annotations: dict[str, str] | None = None,
    *,
    user: int | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The demo pod writing only `limits` (`ai.compute/*`), optionally pinned to a node by
    nodeSelector (not by a claim: the test writes none)."""
    body = pods.manifest(PodSpec(name, run_as_user=user,
                                 annotations=tuple((annotations or {}).items())))  # fmt: skip
    body["spec"]["containers"][0]["resources"] = {"limits": limits}
    if node is not None:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def create(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    return kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", body)


def running(kube: Kube, name: str, timeout: float = 120) -> dict[str, Any]:
    found = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=timeout)
    assert found["status"]["phase"] == "Running", found["status"]
    return found


def unschedulable(kube: Kube, name: str, seconds: float = 6) -> str:
    """kube-scheduler's message for a pod it could not place; the pod stays Pending for
    `seconds` more."""
    wait_for(lambda: pods.condition(pods.get(kube, name) or {}, "PodScheduled").get("reason")
             == "Unschedulable", f"{name} unschedulable", timeout=60)  # fmt: skip
    time.sleep(seconds)
    found = pods.get(kube, name) or {}
    assert found["status"]["phase"] == "Pending" and not found["spec"].get("nodeName"), found
    return str(pods.condition(found, "PodScheduled")["message"])


def gone(cluster: KubeletCluster, *names: str) -> None:
    """The pods deleted and gone, and every node's hcsd holding no claim."""
    for name in names:
        pods.delete(cluster.kube, name, grace=0)
    for name in names:
        wait_for(lambda n=name: pods.get(cluster.kube, n) is None,  # type: ignore[misc]
                 f"{name} is gone", timeout=60)  # fmt: skip
    for node in cluster.nodes.values():
        wait_for(lambda n=node: not held_claims(n), f"{node.name} released its claims",  # type: ignore[misc]
                 timeout=60)  # fmt: skip


def claim_of(kube: Kube, found: dict[str, Any]) -> dict[str, Any]:
    (status,) = found["status"]["resourceClaimStatuses"]
    return kube.get(f"{CLAIMS}/{status['resourceClaimName']}")


def test_a_16gi_pod_runs_with_its_share_enforced_inside(installed: KubeletCluster) -> None:
    """The webhook's template, kube-scheduler's allocation from the published slice, the
    plugin's prepare, and inside the (non-root) container: devices, env, driver files,
    libhcs, the quota file with 16Gi, a second allocation past it refused."""
    cluster, kube = installed, installed.kube
    node = cluster.nodes[GPU]
    name = "dra-16gi"
    create(kube, pod(name, {"ai.compute/vram": "16Gi"}, {"hcs.io/vendors": "nvidia"}, user=USER))
    try:
        found = running(kube, name)
        assert found["spec"]["nodeName"] == GPU
        assert found["spec"]["schedulerName"] == "default-scheduler"
        (reference,) = found["spec"]["resourceClaims"]
        assert reference["name"] == dra.POD_CLAIM_NAME
        template = kube.get(f"{TEMPLATES}/{reference['resourceClaimTemplateName']}")
        assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
            "requests": {"memory": "16Gi", "compute": "0"}}  # fmt: skip
        claim = claim_of(kube, found)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (dra.DRIVER, GPU, "nvidia-0")
        (grant,) = held_claims(node)[f"claim-{claim['metadata']['uid']}"].grants
        assert (grant.device_uuid, grant.vram_bytes) == (node.vendor.uuid, 16 * GiB)

        out = cluster.kubectl("exec", name, "--", "sh", "-c", demo_script(node), timeout=60)
        quota = cluster.kubectl("exec", name, "--", "cat", "/run/hcs/quota.conf")
        print(f"--- {name}:\n{out}\n{quota}")
        check_demo(out, node, USER)
        assert f"device.0.vram_limit={16 * GiB}" in quota
    finally:
        gone(cluster, name)


def test_two_whole_devices_from_one_link_domain(installed: KubeletCluster) -> None:
    """`ai.compute/devices: 2` with `hcs.io/topology-preference: high-bandwidth`: the
    webhook's claim asks two distinct devices on one linkDomain; kube-scheduler passes over
    the lone (free, first) A100 and allocates the NVLink pair; the container gets both
    devices' nodes and uuids, and libhcs's quota file both devices whole."""
    cluster, kube = installed, installed.kube
    node = cluster.nodes[GPU]
    island = node.vendor.peers  # the NVLink pair (vendors.A100_ISLAND)
    name = "dra-island"
    annotations = {"hcs.io/vendors": "nvidia", "hcs.io/topology-preference": "high-bandwidth"}
    create(kube, pod(name, {"ai.compute/devices": "2"}, annotations, user=USER))
    try:
        found = running(kube, name)
        assert found["spec"]["nodeName"] == GPU
        claim = claim_of(kube, found)
        constraints = claim["spec"]["devices"]["constraints"]
        assert {c.get("matchAttribute") or c.get("distinctAttribute") for c in constraints} == {
            f"{dra.DRIVER}/{dra.ATTR_LINK_DOMAIN}",
            f"{dra.DRIVER}/{dra.ATTR_UUID}",
        }, constraints
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == ["nvidia-1", "nvidia-2"], results
        assert {r["pool"] for r in results} == {GPU}
        published = {
            d["name"]: d["attributes"] for d in (slice_of(kube, GPU) or {})["spec"]["devices"]
        }
        domains = {
            published[r["device"]].get(dra.ATTR_LINK_DOMAIN, {}).get("string") for r in results
        }
        assert domains == {"nvidia-nvlink-1"}, published
        assert dra.ATTR_LINK_DOMAIN not in published["nvidia-0"], published
        grants = held_claims(node)[f"claim-{claim['metadata']['uid']}"].grants
        assert sorted((g.device_uuid, g.vram_bytes) for g in grants) == sorted(
            (p.uuid, 80 * GiB) for p in island
        )

        given = [*(n for p in island for n in p.device_nodes), *node.vendor.shared_nodes]
        script = (f"for n in {' '.join(given)} /dev/nvidia0; "
                  "do echo \"node $n $(stat -c '%F %t:%T' $n 2>&1)\"; done; "
                  "env | while read -r line; do echo \"env $line\"; done")  # fmt: skip
        out = cluster.kubectl("exec", name, "--", "sh", "-c", script, timeout=60)
        quota = cluster.kubectl("exec", name, "--", "cat", "/run/hcs/quota.conf")
        print(f"--- {name}:\n{out}\n{quota}")
        lines = out.splitlines()
        for device in given:
            assert f"node {device} character special file 1:3" in lines, out
        assert "node /dev/nvidia0 character special file 1:3" not in lines, out  # not given
        env = dict(line[4:].split("=", 1) for line in lines if line.startswith("env "))
        assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(p.uuid for p in island)
        uuids = {line.split("=", 1)[1] for line in quota.splitlines()
                 if line.startswith("device.") and ".uuid=" in line}  # fmt: skip
        assert uuids == {p.uuid for p in island}, quota
        for i in (0, 1):
            assert f"device.{i}.vram_limit={80 * GiB}" in quota, quota
    finally:
        gone(cluster, name)


def test_tflops_across_vendors_needs_consent(installed: KubeletCluster) -> None:
    """16Gi and 100 TFLOPS of A100 (a share: without VRAM it is whole devices) pinned to the
    Ascend node: without hcs.io/allow-substitution no alternative fits there and it stays
    Pending; with it, the 910B3 substitute's share is allocated there and the pod runs.
    Unpinned without consent, it takes a third of the A100."""
    cluster, kube = installed, installed.kube
    limits = {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"}  # a share
    a100 = {"hcs.io/models": "A100"}
    names = ("dra-tflops-a100", "dra-tflops-no-consent", "dra-tflops-consent")
    try:
        create(kube, pod(names[0], limits, a100))
        found = running(kube, names[0])
        assert found["spec"]["nodeName"] == GPU
        (result,) = claim_of(kube, found)["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"]["compute"] == "33", result

        create(kube, pod(names[1], limits, a100, node=NPU))
        message = unschedulable(kube, names[1])
        print(f"{names[1]}: {message}")
        assert "claim" in message, message

        consent = {**a100, "hcs.io/allow-substitution": "true"}
        create(kube, pod(names[2], limits, consent, node=NPU))
        found = running(kube, names[2])
        assert found["spec"]["nodeName"] == NPU
        claim = claim_of(kube, found)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        # The alternative kube-scheduler took: one naming the 910B3, whose share it consumed
        # (alternatives past Kubernetes' 8 are merged, asking the larger share: 33% here).
        (request,) = claim["spec"]["devices"]["requests"]
        chosen = {a["name"]: a for a in request["firstAvailable"]}[result["request"].split("/")[1]]
        compute = chosen["capacity"]["requests"]["compute"]
        assert "ascend910b3" in chosen["selectors"][0]["cel"]["expression"], chosen
        assert result["device"] == "ascend-0" and result["consumedCapacity"]["compute"] == compute
        assert int(compute) in (32, 33), chosen  # 100 of the 910B3's 313 TFLOPS, or merged
        quota = cluster.kubectl("exec", names[2], "--", "cat", "/run/hcs/quota.conf")
        assert f"device.0.compute_percent={compute}" in quota, quota
    finally:
        gone(cluster, *names)


def test_pods_race_for_the_last_share(installed: KubeletCluster) -> None:
    """One 48Gi pod more than the GPU node has A100s (80Gi each, so one 48Gi share a card):
    all but one run, the last Pending with kube-scheduler's reason, and it runs once one of
    the others is deleted."""
    cluster, kube = installed, installed.kube
    cards = 1 + len(cluster.nodes[GPU].vendor.peers)
    names = tuple(f"dra-race-{i}" for i in range(cards + 1))

    def phases() -> dict[str, str]:
        return {n: (pods.get(kube, n) or {}).get("status", {}).get("phase", "") for n in names}

    try:
        for name in names:
            create(kube, pod(name, {"ai.compute/vram": "48Gi"}, {"hcs.io/vendors": "nvidia"}))
        wait_for(lambda: list(phases().values()).count("Running") == cards,
                 f"{cards} racers run", timeout=120)  # fmt: skip
        (loser,) = [n for n, p in phases().items() if p != "Running"]
        message = unschedulable(kube, loser, seconds=3)
        print(f"{loser}: {message}")
        assert "cannot allocate all claims" in message, message
        assert list(phases().values()).count("Running") == cards
        pods.delete(kube, next(n for n in names if n != loser), grace=0)
        assert running(kube, loser)["spec"]["nodeName"] == GPU
    finally:
        gone(cluster, *names)


def test_an_unhealthy_device_is_tainted_avoided_and_untainted(installed: KubeletCluster) -> None:
    """A fatal ECC count on every A100 (hcsd's simulated counters, as tests/cluster/
    test_dra_slices.py raises them): the syncer taints them in the slice, a pod for NVIDIA
    stays Pending and one for any vendor lands on the Ascend node; after hcsd's quiet period
    the taints go and the NVIDIA pod runs."""
    cluster, kube = installed, installed.kube
    node = cluster.nodes[GPU]
    node_file = node.host_path(hcs.NODE_FILE)
    healthy = node_file.read_text()
    cards = 1 + len(node.vendor.peers)
    names = ("dra-taint-nvidia", "dra-taint-any")
    try:
        # A count hcsd has seen at 0, then 1: a rise is what it acts on (the first reading
        # is the baseline).
        node_file.write_text(node.vendor.node_file(counters={"ecc_uncorrectable": 0}))
        time.sleep(1)  # five polls
        node_file.write_text(node.vendor.node_file(counters={"ecc_uncorrectable": 1}))
        try:
            wait_for(lambda: taints(kube, GPU)
                     == [f"{dra.TAINT_UNHEALTHY}=unhealthy:NoSchedule"] * cards,
                     "every A100 tainted in the slice", timeout=30)  # fmt: skip
        except AssertionError:
            assert node.hcsd is not None
            print(f"--- hcsd on {GPU}:\n{node.hcsd.logs()[-4000:]}")
            raise
        tainted_at = time.monotonic()
        create(kube, pod(names[0], {"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "nvidia"}))
        create(kube, pod(names[1], {"ai.compute/vram": "8Gi"}))
        assert running(kube, names[1])["spec"]["nodeName"] == NPU
        found = pods.get(kube, names[0]) or {}
        if time.monotonic() - tainted_at < DRA_QUIET_PERIOD - 1:  # still tainted: not placed
            assert not found["spec"].get("nodeName"), found
        wait_for(lambda: taints(kube, GPU) == [], "the taint gone on recovery", timeout=60)
        assert running(kube, names[0])["spec"]["nodeName"] == GPU
    finally:
        node_file.write_text(healthy)
        gone(cluster, *names)


DENIED = 'admission webhook "scheduler-name.hcs.io" denied the request: '
REFUSED = {
    # Not a quantity at all: the API server refuses it before any webhook (docs/dra.md).
    "no quantity": ({"ai.compute/vram": "lots"}, {}, "quantities must match the regular"),
    "zero": ({"ai.compute/vram": "0"}, {}, f"{DENIED}container main: ai.compute/vram must be "
             "positive"),
    "negative": ({"ai.compute/vram": "-8Gi"}, {}, f"{DENIED}container main: ai.compute/vram: "
                 "must not be negative, got '-8Gi'"),
    "unknown vendor": ({"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "intel"},
                       f"{DENIED}hcs.io/vendors: unknown vendor 'intel'"),
    "fractional devices": ({"ai.compute/devices": "1500m"}, {},
                           f"{DENIED}container main: ai.compute/devices must be a whole number "
                           "1..64, got 1500m"),
}  # fmt: skip


@pytest.mark.parametrize(("limits", "annotations", "message"), REFUSED.values(),
                         ids=REFUSED.keys())  # fmt: skip
def test_a_malformed_request_is_refused_at_create_and_leaves_no_template(
    installed: KubeletCluster, limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    kube = installed.kube
    before = {t["metadata"]["name"] for t in kube.get(TEMPLATES).get("items", [])}
    with pytest.raises(KubeError) as refused:
        create(kube, pod("dra-refused", limits, annotations))
    print(f"refused: {refused.value}")
    assert message in str(refused.value), refused.value
    assert pods.get(kube, "dra-refused") is None
    assert {t["metadata"]["name"] for t in kube.get(TEMPLATES).get("items", [])} == before


def registrations(cluster: KubeletCluster, node: str) -> int:
    """kubelet's registrations of `node`'s plugin, as its syncer container's log says (the
    current container's: a restarted one starts a new log)."""
    name = syncer_pod(cluster, node)["metadata"]["name"]
    log = cluster.kubectl("logs", "-n", NAMESPACE, name, check=False)
    return log.count("kubelet registered the DRA plugin")


def syncer_pod(cluster: KubeletCluster, node: str) -> dict[str, Any]:
    listed = cluster.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    (found,) = [
        p for p in listed
        if p["spec"].get("nodeName") == node
        and p["metadata"]["labels"].get("app.kubernetes.io/name") == "hcs-syncer"
    ]  # fmt: skip
    return dict(found)


def syncer_restarts(cluster: KubeletCluster, node: str) -> int:
    return int(syncer_pod(cluster, node)["status"]["containerStatuses"][0]["restartCount"])


def syncer_pid(node: KubeletNode) -> int:
    """The pid of the chart's syncer container on `node`: a process of this cluster's own
    containerd (in its node's private cgroup tree), not another run's."""
    (listed,) = node.containerd.crictl_json("ps", "--name", "^syncer$")["containers"]
    info = node.containerd.crictl_json("inspect", listed["id"])
    return int(info["info"]["pid"])


def test_kill_9_of_the_plugin_pod_during_prepare(installed: KubeletCluster) -> None:
    """The syncer container (the plugin) dies with kill -9 just after a pod is made: kubelet
    restarts it, it replaces its stale sockets under the same names, kubelet registers it
    again, and the pod runs with its claim held once."""
    cluster, kube = installed, installed.kube
    node, name = cluster.nodes[GPU], "dra-kill-plugin"
    restarts = syncer_restarts(cluster, GPU)
    pid = syncer_pid(node)
    create(kube, pod(name, {"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "nvidia"}, user=USER))
    at_kill = "held" if held_claims(node) else "not yet held"
    os.kill(pid, signal.SIGKILL)
    print(f"{name}: the plugin was killed with the claim {at_kill}")
    try:
        found = running(kube, name, timeout=180)
        wait_for(lambda: syncer_restarts(cluster, GPU) == restarts + 1,  # the same pod
                 "kubelet restarted the killed syncer container", timeout=60)  # fmt: skip
        wait_for(lambda: registrations(cluster, GPU) >= 1, "kubelet registered the new plugin",
                 timeout=60)  # fmt: skip
        uid = claim_of(kube, found)["metadata"]["uid"]
        (grant,) = held_claims(node)[f"claim-{uid}"].grants
        assert grant.vram_bytes == 8 * GiB
        quota = cluster.kubectl("exec", name, "--", "cat", "/run/hcs/quota.conf")
        assert f"container=claim-{uid}" in quota, quota
    finally:
        gone(cluster, name)


def test_kill_9_of_hcsd_while_a_pod_waits_for_its_prepare(installed: KubeletCluster) -> None:
    """hcsd (the host daemon) is killed with -9: a new pod's prepare fails and it waits;
    hcsd started again, the pod runs, and the claim prepared before the kill is still held."""
    cluster, kube = installed, installed.kube
    node = cluster.nodes[GPU]
    names = ("dra-kept", "dra-kill-hcsd")
    assert node.hcsd is not None and node.hcsd.process is not None
    try:
        create(kube, pod(names[0], {"ai.compute/vram": "4Gi"}, {"hcs.io/vendors": "nvidia"}))
        kept = claim_of(kube, running(kube, names[0]))["metadata"]["uid"]
        failures = syncer_logs(cluster).count("failed to prepare")
        node.hcsd.process.kill()
        node.hcsd.process.wait()
        create(kube, pod(names[1], {"ai.compute/vram": "4Gi"}, {"hcs.io/vendors": "nvidia"}))
        wait_for(lambda: syncer_logs(cluster).count("failed to prepare") > failures,
                 "kubelet's prepare failed while hcsd was down", timeout=60)  # fmt: skip
        assert (pods.get(kube, names[1]) or {})["status"]["phase"] == "Pending"
        node.hcsd.start()
        uid = claim_of(kube, running(kube, names[1], timeout=180))["metadata"]["uid"]
        assert {f"claim-{uid}", f"claim-{kept}"} <= set(held_claims(node))
    finally:
        if node.hcsd.process is None or node.hcsd.process.poll() is not None:
            node.hcsd.start()
        gone(cluster, *names)


def test_kubelet_restart_registers_the_plugin_pod_again(installed: KubeletCluster) -> None:
    """A restarted kubelet finds the syncer pod's registration socket again; the running
    pod's claim is unprepared through the plugin when the pod goes."""
    cluster, kube = installed, installed.kube
    node, name = cluster.nodes[GPU], "dra-kubelet-restart"
    create(kube, pod(name, {"ai.compute/vram": "4Gi"}, {"hcs.io/vendors": "nvidia"}))
    try:
        uid = claim_of(kube, running(kube, name))["metadata"]["uid"]
        before = registrations(cluster, GPU)
        process = node.processes["kubelet"]
        command = [str(a) for a in process.args][len(node.namespace.enter) :]  # type: ignore[union-attr]
        node.stop_process("kubelet")
        node.spawn("kubelet", command)
        wait_for(lambda: registrations(cluster, GPU) > before,
                 "the restarted kubelet registered the plugin", timeout=90)  # fmt: skip
        assert f"claim-{uid}" in held_claims(node)
    finally:
        gone(cluster, name)


QUOTAS = f"/apis/hcs.io/v1alpha1/namespaces/{pods.NAMESPACE}/computequotas"


def test_a_pod_over_its_namespaces_compute_quota_is_refused_at_create(
    installed: KubeletCluster,
) -> None:
    """A ComputeQuota of 20Gi: a 16Gi pod runs (its claim allocated and prepared); an 8Gi
    pod is refused at create with the quota's figures, leaving no pod and no template; with
    the first pod gone the same pod is admitted and runs."""
    cluster, kube = installed, installed.kube
    names = ("dra-quota-16", "dra-quota-8")
    kube.create(QUOTAS, {"apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
                         "metadata": {"name": "limits", "namespace": pods.NAMESPACE},
                         "spec": {"hard": {"vram": "20Gi"}}})  # fmt: skip
    try:
        create(kube, pod(names[0], {"ai.compute/vram": "16Gi"}, {"hcs.io/vendors": "nvidia"}))
        running(kube, names[0])
        before = {t["metadata"]["name"] for t in kube.get(TEMPLATES).get("items", [])}
        with pytest.raises(KubeError) as refused:
            create(kube, pod(names[1], {"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "nvidia"}))
        print(f"refused: {refused.value}")
        assert (f"{DENIED}ComputeQuota {pods.NAMESPACE}/limits: vram 16Gi used + 8Gi requested "
                "exceeds the limit 20Gi") in str(refused.value), refused.value  # fmt: skip
        assert pods.get(kube, names[1]) is None
        assert {t["metadata"]["name"] for t in kube.get(TEMPLATES).get("items", [])} <= before
        gone(cluster, names[0])
        create(kube, pod(names[1], {"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "nvidia"}))
        assert running(kube, names[1])["spec"]["nodeName"] == GPU
    finally:
        with contextlib.suppress(KubeError):
            kube.request("DELETE", f"{QUOTAS}/limits")
        gone(cluster, *names)


def device_health(found: dict[str, Any]) -> dict[str, str]:
    """kubelet's `allocatedResourcesStatus` of the pod's container: health by resource id."""
    statuses = (found.get("status", {}).get("containerStatuses") or [{}])[0]
    return {r["resourceID"]: r.get("health", "")
            for entry in statuses.get("allocatedResourcesStatus") or ()
            for r in entry.get("resources") or ()}  # fmt: skip


def test_the_plugins_health_stream_reaches_the_pods_status(installed: KubeletCluster) -> None:
    """kubelet dials the plugin's health service and writes what hcsd says of the claim's
    device into the running container's `allocatedResourcesStatus` (ResourceHealthStatus,
    beta and on at 1.36), for a slice the syncer published itself; kubelet names the device
    by the CDI id the plugin's prepare returned."""
    cluster, kube = installed, installed.kube
    name = "dra-health"
    create(kube, pod(name, {"ai.compute/vram": "4Gi"}, {"hcs.io/vendors": "nvidia"}))
    try:
        uid = claim_of(kube, running(kube, name))["metadata"]["uid"]
        device = f"{dra.CDI_CLAIM_KIND}={uid}-nvidia-0"  # kubelet names it by the CDI id
        try:
            wait_for(lambda: device_health(pods.get(kube, name) or {}).get(device) == "Healthy",
                     f"{device} Healthy in the pod's status", timeout=60)  # fmt: skip
        finally:
            print(f"{name}: {device_health(pods.get(kube, name) or {})}")
    finally:
        gone(cluster, name)


PROFILES = "/apis/hcs.io/v1alpha1/runtimeprofiles"
PROFILE = "hcs-test-dra-install"
PLACEHOLDER = "registry.example.com/hcs-test/placeholder:never-pulled"


def test_a_runtime_profile_pod_runs_the_chosen_vendors_entry(installed: KubeletCluster) -> None:
    """A pod naming a RuntimeProfile with a placeholder image (never pullable): admitted
    gated, the extender's profile gate chooses a vendor with room, sets the image and
    ungates; kube-scheduler allocates on that vendor's node; the plugin resolves the
    profile's entry for the device and hcsd's NRI plugin gives the container the entry's
    env and entrypoint. Pinned to Ascend by hcs.io/vendors, it runs Ascend's entry."""
    cluster, kube = installed, installed.kube
    entries = [{"vendor": vendor, "image": BUSYBOX_IMAGE,
                "env": [{"name": "PROFILE_VENDOR", "value": vendor}],
                "command": ["sh", "-c", f"echo entrypoint-of-{vendor}; sleep 3600"]}
               for vendor in ("nvidia", "ascend")]  # fmt: skip
    kube.create(PROFILES, {"apiVersion": "hcs.io/v1alpha1", "kind": "RuntimeProfile",
                           "metadata": {"name": PROFILE},
                           "spec": {"runtimes": entries}})  # fmt: skip
    name = "dra-profile"
    body = pod(name, {"ai.compute/vram": "8Gi"},
               {"hcs.io/runtime-profile": PROFILE, "hcs.io/vendors": "ascend"})  # fmt: skip
    body["spec"]["containers"][0]["image"] = PLACEHOLDER
    try:
        made = create(kube, body)
        gates = [g["name"] for g in made["spec"].get("schedulingGates") or ()]
        assert dra.SCHEDULING_GATE_RUNTIME_PROFILE in gates, made["spec"]
        found = running(kube, name, timeout=180)
        assert found["spec"]["nodeName"] == NPU
        assert found["spec"]["containers"][0]["image"] == BUSYBOX_IMAGE
        (result,) = claim_of(kube, found)["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "ascend-0", result
        wait_for(lambda: "entrypoint-of-ascend" in cluster.kubectl("logs", name, check=False),
                 "the profile's entrypoint ran", timeout=30)  # fmt: skip
        env = cluster.kubectl("exec", name, "--", "sh", "-c", "echo $PROFILE_VENDOR")
        assert env.strip() == "ascend", env
    finally:
        with contextlib.suppress(KubeError):
            kube.request("DELETE", f"{PROFILES}/{PROFILE}")
        gone(cluster, name)
