"""A job's pods on one fabric domain, with the real kube-scheduler and the extender.

A control plane of its own (kube-apiserver with the shipped CRDs and RBAC, kube-scheduler with
hcs-scheduler's configuration calling the extender over mutual TLS), and four simulated nodes
of 8 A100s written as hcs-syncer writes them: a1 and a2 in fabric domain ib:a, b1 and b2 in
ib:b. Every pod asks one whole device, so each node scores the same to the planner and only
the fabric rule keeps a job together (without it kube-scheduler spreads the job over ties).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.objects import compute_node, node_spec, node_status
from hcsd.cluster.timefmt import micro_time
from tests.cluster.conftest import _requirements, kustomized, unschedulable_message
from tests.cluster.controlplane import ControlPlane, manifests, register_node
from tests.cluster.jobs import start_extender

pytestmark = pytest.mark.slow

GiB = 2**30
DOMAINS = {"a1": "ib:a", "a2": "ib:a", "b1": "ib:b", "b2": "ib:b"}
HB = {"hcs.io/topology-preference": "high-bandwidth"}


def write_node(kube: Kube, name: str, domain: str, *, busy: int = 0) -> None:
    """The ComputeNode of 8 A100s in `domain`, `busy` of them held by local allocations (no
    pod: hcsctl's), created or replaced, and a fresh heartbeat."""
    devices = [pb.Device(uuid=f"{name}-gpu{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                         vram_bytes=80 * GiB, tflops_fp16=312, health_score=100,
                         health_state=pb.HEALTH_STATE_HEALTHY) for i in range(8)]  # fmt: skip
    allocations = []
    for i in range(busy):
        devices[i].vram_allocated_bytes = 80 * GiB
        devices[i].compute_allocated_percent = 100
        allocations.append(pb.Allocation(
            container_id=f"local-{i}", container_name="local", source="local",
            grants=[pb.Grant(device_uuid=f"{name}-gpu{i}", vram_bytes=80 * GiB,
                             compute_percent=100)]))  # fmt: skip
    node = pb.Node(name=name, version="0.1.0", fabric_domain=domain, fabric_source="config")
    path = f"/apis/hcs.io/v1alpha1/computenodes/{name}"
    try:
        current = kube.get(path)
    except KubeError as e:
        if not e.not_found:
            raise
        current = kube.create("/apis/hcs.io/v1alpha1/computenodes",
                              compute_node(name, node_spec(node, devices)))  # fmt: skip
        register_node(kube, name)
        now = micro_time(time.time())
        kube.create("/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases", {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"hcs-node-{name}", "namespace": "hcs-system"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600, "renewTime": now},
        })  # fmt: skip
    current["status"] = node_status(devices, allocations, previous={}, now="2026-01-01T00:00:00Z")
    kube.request("PUT", f"{path}/status", body=current)


class Fabric:
    def __init__(self, plane: ControlPlane, probes: str) -> None:
        self.plane = plane
        self.kube = plane.kube()
        self.probes = probes

    def metric(self, name: str) -> float:
        url = f"{self.probes}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[-1])
        raise AssertionError(f"no {name} in the extender's metrics")

    def run_job(self, job: str, count: int, annotations: dict[str, str] | None = None) -> None:
        def one(i: int) -> None:
            self.kube.create("/api/v1/namespaces/default/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job}-{i:02d}", "labels": {"job-name": job},
                             "annotations": annotations or {}},
                "spec": {"containers": [{"name": "main", "image": "busybox",
                                         "resources": {"limits": {"ai.compute/devices": "1"}}}]},
            })  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(count)))

    def settle(
        self, job: str, bound: int, *, reason: str = "", timeout: float = 90
    ) -> list[dict[str, Any]]:
        """The job's pods once `bound` of them are bound and the rest marked unschedulable by
        a filter that says `reason` (a pod whose bind lost a race says so until retried)."""
        deadline = time.monotonic() + timeout
        pods: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            pods = self.kube.get("/api/v1/namespaces/default/pods",
                                 [("labelSelector", f"job-name={job}")])["items"]  # fmt: skip
            placed = [p for p in pods if p["spec"].get("nodeName")]
            waiting = [
                p for p in pods
                if not p["spec"].get("nodeName") and reason in unschedulable_message(p)
                and "0/4 nodes are available" in unschedulable_message(p)
            ]  # fmt: skip
            if len(placed) == bound and len(placed) + len(waiting) == len(pods):
                return pods
            time.sleep(0.3)
        raise AssertionError(
            f"{job}: {sum(1 for p in pods if p['spec'].get('nodeName'))} of {len(pods)} bound, "
            f"wanted {bound}\n{self.plane.tail('extender')}\n{self.plane.tail('kube-scheduler')}"
        )

    def delete_job(self, job: str) -> None:
        self.kube.request("DELETE", "/api/v1/namespaces/default/pods",
                          query=[("labelSelector", f"job-name={job}")],
                          body={"gracePeriodSeconds": 0})  # fmt: skip
        deadline = time.monotonic() + 30
        while self.metric("hcs_extender_assigned_pods") > 0:
            assert time.monotonic() < deadline, "the extender still counts deleted pods"
            time.sleep(0.2)


def domains_of(pods: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            found[DOMAINS[node]] = found.get(DOMAINS[node], 0) + 1
    return found


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    binaries, etcd = _requirements()
    work = tmp_path_factory.mktemp("fabric")
    plane = ControlPlane(binaries, etcd, work).start()
    try:
        plane.apply([d for d in manifests(*kustomized()) if d["kind"] != "Secret"])
        kube = plane.kube()
        for name, domain in DOMAINS.items():
            write_node(kube, name, domain)
        extender = start_extender(plane, work, b"0123456789abcdef0123456789abcdef")
        plane.start_scheduler(extender.url)
        yield Fabric(plane, extender.probes)
    finally:
        plane.stop_process("extender")
        plane.stop()


def test_a_16_pod_job_lands_in_one_domain_when_it_fits(fabric: Fabric) -> None:
    fabric.run_job("fits", 16)
    started = time.monotonic()
    pods = fabric.settle("fits", bound=16)
    print(f"16 pods bound in {time.monotonic() - started:.1f}s")
    assert domains_of(pods) == {"ib:a": 16}  # tie on room and nodes: the first name
    fabric.delete_job("fits")


def test_the_job_goes_where_there_is_room_for_it_and_stays_there(fabric: Fabric) -> None:
    """ib:a has 6 devices free, ib:b 16: a 20-pod job asking for high bandwidth fills ib:b
    and its last 4 pods wait, saying why, rather than spill onto ib:a."""
    for name in ("a1", "a2"):
        write_node(fabric.kube, name, DOMAINS[name], busy=5)
    try:
        fabric.run_job("hb", 20, HB)
        reason = (
            "2 node in fabric domain ib:a; the job's is ib:b "
            "(hcs.io/topology-preference: high-bandwidth)"
        )
        pods = fabric.settle("hb", bound=16, reason=reason)  # all 4 left wait for that reason
        assert domains_of(pods) == {"ib:b": 16}
        fabric.delete_job("hb")
        fabric.run_job("spills", 20)  # the same job without the annotation: 4 spill over
        pods = fabric.settle("spills", bound=20)
        assert domains_of(pods) == {"ib:b": 16, "ib:a": 4}
        fabric.delete_job("spills")
    finally:
        for name in ("a1", "a2"):
            write_node(fabric.kube, name, DOMAINS[name])
