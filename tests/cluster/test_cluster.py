"""HCS's cluster side against a real kube-apiserver and kube-scheduler.

Four simulated nodes, each with hcsd and hcs-syncer: gpu-node (2x A100 over NVLink), npu-node
(2x Ascend 910B3, the first unhealthy), mlu-node (4x MLU370-X8), dcu-node (1x Hygon Z100).
The tests run in order in one cluster; each cleans up the pods it made.
"""

from __future__ import annotations

import base64
import json
import math
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from hcsd.api.client import ApiError, Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract.assignment import ANNOTATION, AssignmentError, sign, verify
from hcsd.contract.keyring import Keyring
from tests.cluster.conftest import Cluster, GiB, unschedulable_message
from tests.cluster.controlplane import free_port
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow


def assignment_of(cluster: Cluster, pod: dict) -> dict:
    text = pod["metadata"]["annotations"][ANNOTATION]
    node = pod["spec"]["nodeName"]
    verify(text, cluster.node_keys(node), node=node, pod_uid=pod["metadata"]["uid"],
           now=time.time(), max_age=60)  # fmt: skip
    return json.loads(text)


def test_compute_nodes_mirror_hcsd(cluster: Cluster) -> None:
    nodes = cluster.wait_compute_nodes()
    gpu = nodes["gpu-node"]
    assert [d["model"] for d in gpu["spec"]["devices"]] == ["A100-SXM4-80GB"] * 2
    assert gpu["spec"]["devices"][0]["links"][0]["kind"] == "nvlink"
    assert gpu["status"]["phase"] == "Ready" and gpu["status"]["vramTotal"] == "160Gi"
    npu = nodes["npu-node"]["status"]
    assert npu["phase"] == "Degraded" and npu["health"] == "1/2"
    conditions = {c["type"]: c["status"] for c in npu["conditions"]}
    assert conditions == {"Ready": "True", "HardwareHealthy": "False"}
    # `kubectl get computenodes`: the server renders the CRD's printer columns as a Table.
    table = cluster.kube.request(
        "GET", "/apis/hcs.io/v1alpha1/computenodes",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io",
    )  # fmt: skip
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns == [
        "Name",
        "Vendor",
        "Devices",
        "Unhealthy",
        "ACU-Used",
        "ACU-Total",
        "VRAM-Used",
        "VRAM-Total",
        "VRAM-Free",  # -o wide
        "Health",  # -o wide
        "Phase",
        "Sub-health",  # -o wide
        "Fabric",  # -o wide
        "Slow",  # -o wide
        "Age",
    ]
    rows = {row["cells"][0]: row["cells"] for row in table["rows"]}
    assert rows["gpu-node"][1:11] == [
        "nvidia", 2, 0, 0, 200, "0", "160Gi", "160Gi", "2/2", "Ready",
    ]  # fmt: skip
    assert rows["npu-node"][3] == 1 and rows["npu-node"][9:11] == ["1/2", "Degraded"]
    lease = cluster.kube.get(
        "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/hcs-node-gpu-node"
    )
    assert lease["spec"]["holderIdentity"] == "gpu-node"


def test_vram_pod_gets_a_signed_assignment_that_hcsd_accepts(cluster: Cluster) -> None:
    cluster.create_pod("slice", resources={"ai.compute/vram": "16Gi"},
                       annotations={"hcs.io/vendors": "nvidia"})  # fmt: skip
    pod = cluster.wait_pod("slice")
    assert pod["spec"].get("nodeName") == "gpu-node", unschedulable_message(pod)
    body = assignment_of(cluster, pod)
    grants = body["containers"]["main"]
    assert len(grants) == 1 and grants[0]["vram"] == 16 * GiB
    annotations = pod["metadata"]["annotations"]
    request = pb.PrepareContainerRequest(
        container_id="c-slice", container_name="main",
        pod=pb.PodRef(namespace="default", name="slice", uid=pod["metadata"]["uid"]),
        pod_annotations=annotations,
    )  # fmt: skip
    with Client(cluster.daemons["gpu-node"].socket) as hcsd:
        answer = hcsd.prepare_container(request)
        assert answer.managed and answer.allocation.source == "assignment"
        assert answer.allocation.grants[0].device_uuid == grants[0]["uuid"]
        # The syncer mirrors the allocation: the extender then counts it once, from the status.
        forged_body = {k: v for k, v in body.items() if k != "sig"}
        forged_body["containers"] = {"main": [{**grants[0], "vram": 80 * GiB}]}
        forged = dict(annotations, **{ANNOTATION: sign(forged_body, b"not-the-cluster-key-000000")})
        with pytest.raises(ApiError, match="signature does not verify"):
            hcsd.prepare_container(pb.PrepareContainerRequest(
                container_id="c-forged", container_name="main", pod=request.pod,
                pod_annotations=forged))  # fmt: skip
        with pytest.raises(AssignmentError):
            verify(forged[ANNOTATION], cluster.node_keys("gpu-node"), node="gpu-node",
                   pod_uid=request.pod.uid, now=time.time(), max_age=60)  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status = cluster.kube.get("/apis/hcs.io/v1alpha1/computenodes/gpu-node")["status"]
            if status["allocations"]:
                break
            time.sleep(0.2)
        assert [a["podUID"] for a in status["allocations"]] == [request.pod.uid]
        assert status["vramFree"] == "144Gi"
        hcsd.container_gone(pb.ContainerGoneRequest(container_id="c-slice", deleted=True))
    cluster.delete_pod("slice")


@pytest.mark.parametrize(
    ("vendor", "tflops", "devices"), [("cambricon", 96, 2), ("nvidia", 312, 1)]
)
def test_tflops_pod_gets_enough_devices(
    cluster: Cluster, vendor: str, tflops: float, devices: int
) -> None:
    name = f"tflops-{vendor}"
    # TFLOPS alone means whole devices; with a VRAM slice, a share of one device's compute.
    resources = {"ai.compute/tflops-fp16": "100"}
    if devices == 1:
        resources["ai.compute/vram"] = "16Gi"
    cluster.create_pod(name, resources=resources, annotations={"hcs.io/vendors": vendor})
    pod = cluster.wait_pod(name)
    assert pod["spec"].get("nodeName"), unschedulable_message(pod)
    grants = assignment_of(cluster, pod)["containers"]["main"]
    assert len(grants) == devices == math.ceil(100 / tflops)
    if devices == 1:
        assert grants[0]["compute"] == math.ceil(100 / tflops * 100)  # a 33% share of one A100
        assert grants[0]["vram"] == 16 * GiB
    else:
        assert all(g["compute"] == 100 and g["vram"] == 48 * GiB for g in grants)
    cluster.delete_pod(name)


def test_substitution_only_with_consent(cluster: Cluster) -> None:
    # Fill both A100s with a two-device, best-linked pod first.
    cluster.create_pod("fill-gpus", resources={"ai.compute/devices": "2"},
                       annotations={"hcs.io/vendors": "nvidia",
                                    "hcs.io/topology-preference": "high-bandwidth"})  # fmt: skip
    filled = cluster.wait_pod("fill-gpus")
    assert filled["spec"].get("nodeName") == "gpu-node", unschedulable_message(filled)
    assert len(assignment_of(cluster, filled)["containers"]["main"]) == 2

    cluster.create_pod("wants-a100", resources={"ai.compute/devices": "1"},
                       annotations={"hcs.io/models": "A100"})  # fmt: skip
    refused = cluster.wait_pod("wants-a100")
    assert not refused["spec"].get("nodeName")
    message = unschedulable_message(refused)
    assert (
        "no device matches models" in message and "insufficient" not in message.lower()
    ) or message

    cluster.create_pod("a100-or-equivalent", resources={"ai.compute/devices": "1"},
                       annotations={"hcs.io/models": "A100",
                                    "hcs.io/allow-substitution": "true"})  # fmt: skip
    pod = cluster.wait_pod("a100-or-equivalent")
    node = pod["spec"].get("nodeName")
    assert node in ("npu-node", "mlu-node"), unschedulable_message(pod)
    grants = assignment_of(cluster, pod)["containers"]["main"]
    per_device = {"npu-node": 313, "mlu-node": 96}[node]
    assert len(grants) == math.ceil(312 / per_device)  # exchange rate through FP16 TFLOPS
    for name in ("fill-gpus", "wants-a100", "a100-or-equivalent"):
        cluster.delete_pod(name)


def test_unhealthy_device_is_avoided(cluster: Cluster) -> None:
    cluster.create_pod("on-npu", resources={"ai.compute/vram": "8Gi"},
                       annotations={"hcs.io/vendors": "ascend"})  # fmt: skip
    pod = cluster.wait_pod("on-npu")
    assert pod["spec"].get("nodeName") == "npu-node", unschedulable_message(pod)
    (grant,) = assignment_of(cluster, pod)["containers"]["main"]
    assert grant["uuid"].startswith("NPU-0001")  # device 0 is unhealthy
    cluster.create_pod("two-npus", resources={"ai.compute/devices": "2"},
                       annotations={"hcs.io/vendors": "ascend"})  # fmt: skip
    refused = cluster.wait_pod("two-npus")
    assert not refused["spec"].get("nodeName")
    print("two npus:", unschedulable_message(refused))
    assert "1 have it" in unschedulable_message(refused) or "unhealthy" in unschedulable_message(
        refused
    )
    cluster.delete_pod("on-npu")
    cluster.delete_pod("two-npus")


def test_quota_exceeded_is_unschedulable_with_the_reason(cluster: Cluster) -> None:
    cluster.kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": "team-q"}})  # fmt: skip
    cluster.kube.create("/apis/hcs.io/v1alpha1/namespaces/team-q/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": "team-q"},
        "spec": {"hard": {"vram": "20Gi", "devices": 4}},
    })  # fmt: skip
    # The extender knows the quota once its status writer (every 0.5 s) has put the zero usage.
    path = "/apis/hcs.io/v1alpha1/namespaces/team-q/computequotas/limits"
    wait_for(lambda: cluster.kube.get(path).get("status", {}).get("used", {}).get("vram") == "0",
             "the extender's first status of the quota", timeout=10)  # fmt: skip
    cluster.create_pod("first", namespace="team-q", resources={"ai.compute/vram": "16Gi"})
    first = cluster.wait_pod("first", namespace="team-q")
    assert first["spec"].get("nodeName"), unschedulable_message(first)
    cluster.create_pod("second", namespace="team-q", resources={"ai.compute/vram": "16Gi"})
    second = cluster.wait_pod("second", namespace="team-q")
    assert not second["spec"].get("nodeName")
    message = unschedulable_message(second)
    assert (
        "ComputeQuota team-q/limits: vram 16Gi used + 16Gi requested exceeds the limit 20Gi"
        in message
    )
    deadline = time.monotonic() + 10
    used = {}
    while time.monotonic() < deadline:
        quota = cluster.kube.get("/apis/hcs.io/v1alpha1/namespaces/team-q/computequotas/limits")
        used = quota.get("status", {}).get("used", {})
        if used.get("vram") == "16Gi":
            break
        time.sleep(0.2)
    assert used.get("vram") == "16Gi" and used.get("devices") == "1"
    cluster.delete_pod("first", "team-q")
    cluster.delete_pod("second", "team-q")


def test_two_pods_racing_for_the_last_slice(cluster: Cluster) -> None:
    for name in ("racer-a", "racer-b"):
        cluster.create_pod(name, resources={"ai.compute/vram": "20Gi"},
                           annotations={"hcs.io/vendors": "hygon"})  # fmt: skip
    pods = [cluster.wait_pod(name) for name in ("racer-a", "racer-b")]
    bound = [p for p in pods if p["spec"].get("nodeName")]
    assert len(bound) == 1, [unschedulable_message(p) for p in pods]
    loser = next(p for p in pods if not p["spec"].get("nodeName"))
    print("race loser:", unschedulable_message(loser))
    assert "20Gi wanted, most free is 12Gi on Z100#0" in unschedulable_message(loser)
    for name in ("racer-a", "racer-b"):
        cluster.delete_pod(name)


def test_restarts_lose_nothing(cluster: Cluster) -> None:
    cluster.create_pod("survivor", resources={"ai.compute/vram": "24Gi"},
                       annotations={"hcs.io/vendors": "cambricon"})  # fmt: skip
    pod = cluster.wait_pod("survivor")
    assert pod["spec"].get("nodeName") == "mlu-node", unschedulable_message(pod)
    with Client(cluster.daemons["mlu-node"].socket) as hcsd:
        hcsd.prepare_container(pb.PrepareContainerRequest(
            container_id="c-survivor", container_name="main",
            pod=pb.PodRef(namespace="default", name="survivor", uid=pod["metadata"]["uid"]),
            pod_annotations=pod["metadata"]["annotations"]))  # fmt: skip
    path = "/apis/hcs.io/v1alpha1/computenodes/mlu-node"

    def settled() -> dict:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status = cluster.kube.get(path).get("status", {})
            if [a["containerID"] for a in status.get("allocations", [])] == ["c-survivor"]:
                return status
            time.sleep(0.2)
        raise AssertionError(cluster.log("syncer-mlu-node"))

    before = settled()
    cluster.kill_syncer("mlu-node")
    cluster.start_syncer("mlu-node")
    time.sleep(3)
    assert settled() == before

    cluster.plane.stop_process("kube-apiserver")
    with Client(cluster.daemons["mlu-node"].socket) as hcsd:  # changes while the API is away
        hcsd.container_gone(pb.ContainerGoneRequest(container_id="c-survivor", deleted=True))
    time.sleep(2)
    cluster.plane.start_apiserver()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if not cluster.kube.get(path)["status"]["allocations"]:
                break
        except Exception:
            pass
        time.sleep(0.3)
    assert cluster.kube.get(path)["status"]["allocations"] == []
    cluster.delete_pod("survivor")
    cluster.create_pod("after-restart", resources={"ai.compute/vram": "8Gi"},
                       annotations={"hcs.io/vendors": "cambricon"})  # fmt: skip
    after = cluster.wait_pod("after-restart", timeout=60)
    assert after["spec"].get("nodeName") == "mlu-node", unschedulable_message(after)
    cluster.delete_pod("after-restart")


def test_a_node_whose_heartbeat_stops_gets_no_pods(cluster: Cluster) -> None:
    cluster.kill_syncer("dcu-node")
    time.sleep(10)  # the test Lease lasts 8 s
    cluster.create_pod("late", resources={"ai.compute/vram": "1Gi"},
                       annotations={"hcs.io/vendors": "hygon"})  # fmt: skip
    pod = cluster.wait_pod("late")
    assert not pod["spec"].get("nodeName")
    print("stale:", unschedulable_message(pod))
    assert "hcs heartbeat is" in unschedulable_message(pod)
    cluster.start_syncer("dcu-node")
    cluster.delete_pod("late")


def prepare(cluster: Cluster, pod: dict, container: str, node: str = "gpu-node") -> pb.Allocation:
    """The runtime creating one of the pod's containers on its node: hcsd verifies (or
    recognises) the pod's assignment and holds its grants."""
    meta = pod["metadata"]
    request = pb.PrepareContainerRequest(
        container_id=container, container_name="main",
        pod=pb.PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        pod_annotations=meta["annotations"],
    )  # fmt: skip
    with Client(cluster.daemons[node].socket) as hcsd:
        answer = hcsd.prepare_container(request)
    assert answer.managed
    return answer.allocation


def gone(cluster: Cluster, container: str, node: str = "gpu-node") -> None:
    with Client(cluster.daemons[node].socket) as hcsd:
        hcsd.container_gone(pb.ContainerGoneRequest(container_id=container, deleted=True))


def test_a_node_refuses_what_another_nodes_keys_sign(cluster: Cluster) -> None:
    """Root on mlu-node holds mlu-node's keys (its keyring file) and signs an assignment for
    gpu-node with them: gpu-node's hcsd refuses it."""
    cluster.create_pod("forged", resources={"ai.compute/vram": "1Gi"},
                       annotations={"hcs.io/vendors": "nvidia"})  # fmt: skip
    pod = cluster.wait_pod("forged")
    body = json.loads(pod["metadata"]["annotations"][ANNOTATION])
    stolen = json.loads(cluster.daemons["mlu-node"].keyring_file.read_text())
    assert stolen["node"] == "mlu-node"
    key = base64.b64decode(stolen["keys"][body["kid"]])
    body["containers"]["main"][0]["vram"] = 80 * GiB
    pod["metadata"]["annotations"][ANNOTATION] = sign(body, key)
    with pytest.raises(ApiError, match="signature does not verify"):
        prepare(cluster, pod, "c-forged")
    cluster.delete_pod("forged")


def assigned_pods(cluster: Cluster) -> int:
    """The pods the extender counts as holding devices (its /metrics)."""
    with urllib.request.urlopen(f"{cluster.probe_url}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("hcs_extender_assigned_pods "):
                return int(float(line.split()[1]))
    raise AssertionError("no hcs_extender_assigned_pods in /metrics")


def test_rotation_refuses_no_container_at_any_step(cluster: Cluster) -> None:
    """docs/cluster.md, Rotating keys, end to end: the Secret changes, the extender signs from
    it, each syncer fetches its node's keys, hcsd verifies. At every step a new pod starts and
    every earlier pod's container restarts; pods signed with a retired key keep counting in
    the extender's view (node usage, quotas) until the key is removed, after them."""
    old = cluster.keys
    new_key = base64.b64encode(os.urandom(32))
    both = {**old.keys, "k2": new_key}
    steps = [
        ("add k2", Keyring(both, "k1"), {"k1", "k2"}),
        ("sign with k2", Keyring(both, "k2"), {"k1", "k2"}),
        ("retire k1", Keyring(both, "k2", retired=frozenset({"k1"})), {"k2"}),
    ]
    running: dict[str, tuple[dict, str]] = {}

    def new_pod(name: str, kid: str) -> None:
        cluster.create_pod(name, resources={"ai.compute/vram": "1Gi"},
                           annotations={"hcs.io/vendors": "nvidia"})  # fmt: skip
        pod = cluster.wait_pod(name)
        assert pod["spec"].get("nodeName") == "gpu-node", unschedulable_message(pod)
        assert json.loads(pod["metadata"]["annotations"][ANNOTATION])["kid"] == kid
        prepare(cluster, pod, f"{name}-0")
        running[name] = (pod, f"{name}-0")

    def restart_all(number: int) -> None:
        for name, (pod, container) in running.items():
            gone(cluster, container)
            prepare(cluster, pod, f"{name}-{number}")  # a restart: accepted
            running[name] = (pod, f"{name}-{number}")

    new_pod("rot-0", "k1")
    counted = assigned_pods(cluster)
    for number, (step, keys, held) in enumerate(steps, 1):
        cluster.write_secret(keys)
        cluster.wait_keys(held)  # the operator waits for this before the next step
        time.sleep(1)  # the extender reads its Secret again (--keys-reload-seconds 0.5)
        restart_all(number)
        new_pod(f"rot-{number}", keys.signing)
        counted += 1
        assert assigned_pods(cluster) == counted, step  # k1's pods count on after retirement
        print(step, "ok")
    # 4. Remove k1 once no running pod names it: its pods are gone first.
    for name in ("rot-0", "rot-1"):
        gone(cluster, running.pop(name)[1])
        cluster.delete_pod(name)
    cluster.write_secret(Keyring({"k2": new_key}, "k2"))
    cluster.wait_keys({"k2"})
    time.sleep(1)
    restart_all(len(steps) + 1)
    new_pod("rot-4", "k2")
    for name, (_, container) in running.items():
        gone(cluster, container)
        cluster.delete_pod(name)


def test_two_extender_replicas_only_the_leader_serves(cluster: Cluster) -> None:
    """Runs last: it stops the first replica."""
    port, probes = free_port(), free_port()
    log = open(cluster.work / "extender-1.log", "ab")  # noqa: SIM115
    standby = subprocess.Popen(
        cluster.extender_command(port, probes, "extender-1", free_port()),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{probes}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"{base}/readyz", timeout=2)
        assert not_ready.value.code == 503
        certs = cluster.plane.work / "certs"
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        context.load_cert_chain(str(certs / "scheduler.crt"), str(certs / "scheduler.key"))
        bind = urllib.request.Request(
            f"https://127.0.0.1:{port}/bind", method="POST",
            headers={"Content-Type": "application/json"},
            data=json.dumps({"PodName": "x", "PodNamespace": "default", "PodUID": "u",
                             "Node": "gpu-node"}).encode(),
        )  # fmt: skip
        with urllib.request.urlopen(bind, timeout=5, context=context) as answer:
            assert "not the leader" in json.loads(answer.read())["Error"]
        assert cluster.extender is not None
        cluster.extender.kill()  # the leader dies without giving the Lease back
        cluster.extender.wait()
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError("the standby did not take over:\n" + cluster.log("extender-1"))
        lease = cluster.kube.get(
            "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases/hcs-scheduler-extender"
        )
        assert lease["spec"]["holderIdentity"] == "extender-1"
        assert lease["spec"]["leaseTransitions"] >= 1
    finally:
        standby.kill()
        standby.wait()
