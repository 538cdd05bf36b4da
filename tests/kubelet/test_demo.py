"""HCS's demo, as a user runs it: a pod asking `ai.compute/vram: 16Gi` on a two-node
cluster with real kubelets (tests/harness/kubecluster), once pinned to each vendor.

Each pod must be bound to its vendor's node with a signed assignment and get, from inside
(kubectl exec, through the API server and the node's kubelet): the vendor's device nodes and
env, the driver's files from the host, libhcs loaded (/etc/ld.so.preload and the process's
maps), 10Gi through the vendor's own API and a second 10Gi refused with its own error code,
the 16Gi shared by two processes. The ComputeNode shows the slice; it goes when the pod's
container exits or the pod is deleted (timed and printed). A pod larger than any device
stays Pending with each node's reason; a non-root pod gets the same enforcement. At the end,
after pods of both vendors are gone, nothing of them is left on either node.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from hcsd.contract.assignment import ANNOTATION, verify
from tests.harness.kubecluster import hcs, pods
from tests.harness.kubecluster.cluster import NODES, KubeletCluster
from tests.harness.kubecluster.leftovers import Gone, leftovers, sandbox_of
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.kubecluster.pods import TOOLS, PodSpec
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow

GiB = 2**30
VENDOR_NODE = {vendor.vendor: name for name, vendor in NODES.items()}
# How soon after the pod's deletion its quota directory must have left /run/hcsd/containers:
# hcsd removes it at NRI StopContainer (0.05-1.8 s seen); before that it waited for
# RemoveContainer, which kubelet's container GC sends up to about a minute later.
DIRECTORY_BOUND = 10.0
ALLOCATION_BOUND = 10.0  # released at NRI StopContainer


DELETED: list[Gone] = []  # the pods this module deleted, for the last test to look for


class DirectoryWatch:
    """When each deleted pod's quota directory left /run/hcsd/containers, seen by a thread
    that looks every 50 ms from the deletion on (tests go on meanwhile)."""

    def __init__(self, cluster: KubeletCluster) -> None:
        self.cluster = cluster
        self.left: dict[str, float] = {}  # pod name: seconds after its deletion
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="quota-directories", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.05):
            for gone in list(DELETED):
                path = self.cluster.nodes[gone.node].host_path(
                    f"{hcs.RUN_DIR}/containers/{gone.container}"
                )
                if gone.name not in self.left and not path.exists():
                    self.left[gone.name] = time.monotonic() - gone.at

    def all_left(self) -> bool:
        return all(gone.name in self.left for gone in DELETED)


@pytest.fixture(scope="module")
def directories(kubelet_cluster: KubeletCluster) -> Iterator[DirectoryWatch]:
    watch = DirectoryWatch(kubelet_cluster)
    yield watch
    watch.stopping.set()
    watch.thread.join()


def deleted(node: KubeletNode, pod: dict[str, Any], at: float) -> Gone:
    """`pod` (as read before its deletion) as the node knows it."""
    uid = pod["metadata"]["uid"]
    ctr = pods.container_id(pod)
    return Gone(node.name, pod["metadata"]["name"], uid, ctr, sandbox_of(node, uid), at)


@pytest.fixture
def cluster(
    kubelet_cluster: KubeletCluster, directories: DirectoryWatch
) -> Iterator[KubeletCluster]:
    """The shared cluster; pods a test leaves are deleted after it."""
    before = {p["metadata"]["name"] for p in _pods(kubelet_cluster)}
    yield kubelet_cluster
    for pod in _pods(kubelet_cluster):
        if pod["metadata"]["name"] not in before:
            pods.delete(kubelet_cluster.kube, pod["metadata"]["name"], grace=0)


def _pods(cluster: KubeletCluster) -> list[dict[str, Any]]:
    listed = cluster.kube.get(f"/api/v1/namespaces/{pods.NAMESPACE}/pods")
    return list(listed["items"])


def demo_script(node: KubeletNode) -> str:
    """What the test runs in the container: its uid, devices, env, driver file, preload, then
    two processes of the container allocating through the vendor's API."""
    vendor = node.vendor
    app = f"{TOOLS}/alloc_app {vendor.api}"
    return f"""
echo "uid=$(id -u)"
for n in {" ".join(vendor.all_device_nodes())}; do echo "node $n $(stat -c '%F %t:%T' $n)"; done
env | while read -r line; do echo "env $line"; done
echo "driver=$(cat {vendor.install_dir}/{vendor.marker})"
echo "preload=$(cat /etc/ld.so.preload)"
{app} --hold 10240 10240 > /tmp/first 2>&1 &
first=$!
i=0; while ! grep -q holding /tmp/first && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
while read -r line; do echo "first: $line"; done < /tmp/first
grep -q /usr/lib/hcs/libhcs.so /proc/$first/maps && echo "first maps /usr/lib/hcs/libhcs.so"
{app} 10240 6144 > /tmp/second 2>&1
while read -r line; do echo "second: $line"; done < /tmp/second
kill $first
"""


def check_demo(out: str, node: KubeletNode, uid: int) -> None:
    """What demo_script printed in a 16Gi pod on `node`, running as `uid`: the vendor's device
    nodes, env and driver file, libhcs preloaded and HCS_CONFIG set, and the quota held across
    the container's two processes (the second is refused what the first holds)."""
    lines = out.splitlines()
    assert f"uid={uid}" in lines, out
    for device in node.vendor.all_device_nodes():
        assert f"node {device} character special file 1:3" in lines, out
    env = dict(line[4:].split("=", 1) for line in lines if line.startswith("env "))
    for key, value in node.vendor.env:
        assert env.get(key) == value, (key, env)
    assert env["HCS_CONFIG"] == "/run/hcs/quota.conf"
    assert f"driver={node.vendor.marker_text(node.name).strip()}" in lines, out
    assert "preload=/usr/lib/hcs/libhcs.so" in lines, out
    refused = f"refused (code {node.vendor.oom_code})"
    assert [line for line in lines if line.startswith("first: ")] == [
        "first: libhcs mapped: yes",
        "first: alloc 10240 MiB: ok",
        f"first: alloc 10240 MiB: {refused}",
        "first: holding",
    ], out
    assert "first maps /usr/lib/hcs/libhcs.so" in lines, out
    assert [line for line in lines if line.startswith("second: ")] == [
        "second: libhcs mapped: yes",
        f"second: alloc 10240 MiB: {refused}",  # the first process holds 10 of the 16Gi
        "second: alloc 6144 MiB: ok",
    ], out


def allocation_of(cluster: KubeletCluster, node: str, uid: str) -> dict[str, object] | None:
    computenode = cluster.kube.get(f"/apis/hcs.io/v1alpha1/computenodes/{node}")
    for allocation in (computenode.get("status") or {}).get("allocations") or []:
        if allocation["podUID"] == uid:
            return dict(allocation)
    return None


def wait_released(cluster: KubeletCluster, node: str, uid: str, since: float) -> float:
    """Seconds from `since` until the pod's allocation left its ComputeNode."""
    wait_for(
        lambda: allocation_of(cluster, node, uid) is None,
        f"pod {uid}'s allocation left ComputeNode {node}",
        timeout=ALLOCATION_BOUND,
        interval=0.05,
    )
    return time.monotonic() - since


def run_demo(cluster: KubeletCluster, name: str, vendor: str, user: int | None) -> None:
    node = cluster.nodes[VENDOR_NODE[vendor]]
    created = pods.create(cluster.kube, PodSpec(name, vendor=vendor, run_as_user=user))
    uid = created["metadata"]["uid"]
    pod = pods.wait_phase(cluster.kube, name, {"Running", "Failed", "Succeeded"})
    assert pod["status"]["phase"] == "Running", pod["status"]

    # Bound to its vendor's node, with an assignment signed for that node and pod.
    assert pod["spec"]["nodeName"] == node.name
    assignment = verify(
        pod["metadata"]["annotations"][ANNOTATION],
        hcs.verifying_keys(cluster.keys, node.name),
        node=node.name,
        pod_uid=uid,
        now=time.time(),
        max_age=60,
    )
    assert [(g.device_uuid, g.vram_bytes) for g in assignment.containers["main"]] == [
        (node.vendor.uuid, 16 * GiB)
    ]

    out = cluster.kubectl("exec", name, "--", "sh", "-c", demo_script(node), timeout=60)
    print(f"--- {name} on {node.name}:\n{out}")
    check_demo(out, node, user or 0)

    # The slice in the ComputeNode, from the assignment (the syncer mirrors it on its own time).
    wait_for(lambda: allocation_of(cluster, node.name, uid) is not None, "the slice shows")
    allocation = allocation_of(cluster, node.name, uid)
    assert allocation is not None
    computenode = cluster.kube.get(f"/apis/hcs.io/v1alpha1/computenodes/{node.name}")
    [device] = computenode["status"]["devices"]
    assert (device["uuid"], device["vramAllocatedBytes"]) == (node.vendor.uuid, 16 * GiB)
    assert allocation["container"] == "main" and allocation["source"] == "assignment"
    assert allocation["grants"] == [{"uuid": node.vendor.uuid, "vramBytes": 16 * GiB,
                                     "compute": 0}]  # fmt: skip
    assert node.host_path(f"{hcs.RUN_DIR}/containers/{pods.container_id(pod)}").is_dir()

    started = time.monotonic()
    gone = deleted(node, pod, started)
    pods.delete(cluster.kube, name)
    seconds = wait_released(cluster, node.name, uid, started)
    print(f"{name}: allocation left ComputeNode {node.name} {seconds:.2f} s after the delete")
    DELETED.append(gone)


@pytest.mark.parametrize("vendor", ["nvidia", "ascend"])
def test_the_demo_pod_gets_its_vendor_and_its_quota(cluster: KubeletCluster, vendor: str) -> None:
    run_demo(cluster, f"demo-{vendor}", vendor, None)


@pytest.mark.parametrize("vendor", ["nvidia", "ascend"])
def test_a_non_root_pod_gets_the_same_enforcement(cluster: KubeletCluster, vendor: str) -> None:
    run_demo(cluster, f"demo-{vendor}-uid1000", vendor, 1000)


@pytest.mark.parametrize("vendor", ["nvidia", "ascend"])
def test_the_slice_is_released_when_the_container_exits(
    cluster: KubeletCluster, vendor: str
) -> None:
    node = cluster.nodes[VENDOR_NODE[vendor]]
    name = f"exits-{vendor}"
    # It exits only once the test has seen the slice (a file made through kubectl exec).
    script = (
        f"{TOOLS}/alloc_app {node.vendor.api} 10240; "
        "until [ -e /tmp/slice-seen ]; do sleep 0.05; done"
    )
    created = pods.create(cluster.kube, PodSpec(name, vendor=vendor, command=script))
    uid = created["metadata"]["uid"]
    wait_for(lambda: allocation_of(cluster, node.name, uid) is not None, "the slice shows")
    pods.wait_phase(cluster.kube, name, {"Running"})
    cluster.kubectl("exec", name, "--", "touch", "/tmp/slice-seen")
    pod = pods.wait_phase(cluster.kube, name, {"Succeeded", "Failed"})
    ended = time.monotonic()
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    seconds = wait_released(cluster, node.name, uid, ended)
    print(f"{name}: allocation left ComputeNode {node.name} {seconds:.2f} s after the pod ended")
    quota = node.host_path(f"{hcs.RUN_DIR}/containers/{pods.container_id(pod)}")
    wait_for(lambda: not quota.exists(), "the quota directory left", timeout=DIRECTORY_BOUND)
    print(f"{name}: quota directory gone {time.monotonic() - ended:.2f} s after the pod ended")
    logs = cluster.kubectl("logs", name)
    assert "alloc 10240 MiB: ok" in logs, logs
    gone = deleted(node, pod, time.monotonic())
    pods.delete(cluster.kube, name)
    DELETED.append(gone)


def failed_scheduling(cluster: KubeletCluster, name: str) -> bool:
    events = cluster.kube.get(
        f"/api/v1/namespaces/{pods.NAMESPACE}/events",
        query=[("fieldSelector", f"involvedObject.name={name},reason=FailedScheduling")],
    )
    return bool(events.get("items"))


def test_a_pod_larger_than_any_device_stays_pending_with_each_nodes_reason(
    cluster: KubeletCluster,
) -> None:
    name = "too-big"
    pods.create(cluster.kube, PodSpec(name, vram="100Gi"))
    wait_for(
        lambda: (
            pods.condition(pods.get(cluster.kube, name) or {}, "PodScheduled").get("reason")
            == "Unschedulable"
        ),
        "the scheduler gave up on the pod",
    )
    # The scheduler's verdict is recorded: it tries again only on a change in the cluster.
    wait_for(lambda: failed_scheduling(cluster, name), "the FailedScheduling event was recorded")
    pod = pods.get(cluster.kube, name)
    assert pod is not None
    message = pods.condition(pod, "PodScheduled")["message"]
    print(f"{name}: {message}")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert message.startswith("0/2 nodes are available"), message
    for node in cluster.nodes.values():
        assert f"{node.vendor.model}: 100Gi wanted" in message, message
    pods.delete(cluster.kube, name, grace=0)


def test_nothing_is_left_after_pods_of_both_vendors_end(
    cluster: KubeletCluster, directories: DirectoryWatch
) -> None:
    """Pods of both vendors holding memory, deleted together: the allocation leaves each
    ComputeNode, the quota directory leaves /run/hcsd/containers (both timed), and then no
    process, mount, cgroup, directory or ledger entry of any deleted pod is left."""
    running = {}
    for vendor, node_name in VENDOR_NODE.items():
        app = f"{TOOLS}/alloc_app {cluster.nodes[node_name].vendor.api} --hold 8192"
        name = f"last-{vendor}"
        command = f"trap 'exit 0' TERM; {app} & wait"  # a PID 1 that stops on TERM
        pods.create(cluster.kube, PodSpec(name, vendor=vendor, command=command))
        running[name] = node_name
    for name in running:
        pods.wait_phase(cluster.kube, name, {"Running"})
    read = {name: pods.get(cluster.kube, name) for name in running}
    records = [deleted(cluster.nodes[running[n]], pod, 0) for n, pod in read.items() if pod]
    for record in records:  # the slices show before the pods go
        wait_for(partial(allocation_of, cluster, record.node, record.uid), f"{record.name}'s slice")
    started = time.monotonic()
    for name in running:
        pods.delete(cluster.kube, name)
    DELETED.extend(dataclasses.replace(r, at=started) for r in records)
    for entry in DELETED[-2:]:
        seconds = wait_released(cluster, entry.node, entry.uid, entry.at)
        print(f"{entry.name}: allocation left ComputeNode {entry.node} {seconds:.2f} s after")

    wait_for(
        directories.all_left, "every quota directory left", timeout=DIRECTORY_BOUND, interval=0.1
    )
    for entry in DELETED:
        print(
            f"{entry.name}: quota directory left /run/hcsd/containers on {entry.node} "
            f"{directories.left[entry.name]:.2f} s after the pod's deletion"
        )
        assert directories.left[entry.name] <= DIRECTORY_BOUND

    seen: dict[str, float] = {}

    def nothing_left() -> bool:
        for node in cluster.nodes.values():
            for where in leftovers(cluster, node, DELETED):
                seen[where] = time.monotonic() - started
        return not any(leftovers(cluster, node, DELETED) for node in cluster.nodes.values())

    try:
        wait_for(nothing_left, "nothing of the deleted pods is left", timeout=90, interval=0.5)
        print(f"nothing left {time.monotonic() - started:.1f} s after the last deletion")
        for where, last in sorted(seen.items(), key=lambda item: item[1]):
            print(f"  {where}: last seen {last:.1f} s after it")
    finally:
        for node in cluster.nodes.values():
            left = leftovers(cluster, node, DELETED)
            print(f"{node.name}: left behind: {json.dumps(left) if left else 'nothing'}")
