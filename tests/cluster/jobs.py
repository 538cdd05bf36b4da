"""Simulated fleets and jobs for the real kube-scheduler with hcs-scheduler-extender.

A simulated node is what hcs-syncer would write for a node of eight A100s (its Node, its
ComputeNode with status, a fresh heartbeat Lease): no hcsd runs, so thousands fit on one
machine. A job is N pods created at once, as a Job controller would, each labelled
`hcs.io/job`. Shared by tests/cluster/test_jobs.py and the benchmarks (bench/job_bench.py,
bench/cluster_bench.py), which time what the tests check.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import compute_node, node_spec, node_status
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.assignment import ANNOTATION, verify
from hcsd.contract.keyring import Keyring, derive
from tests.cluster.controlplane import REPO, ControlPlane, free_port, register_node

GiB = 2**30
JOB_LABEL = "hcs.io/job"


def simulated_node(
    kube: Kube,
    name: str,
    devices: int = 8,
    *,
    vendor: str = "nvidia",
    model: str = "A100-SXM4-80GB",
) -> None:
    """A Node, its ComputeNode (`devices` x A100 80G, or another `vendor` and `model` of 80G)
    and a fresh heartbeat, as a syncer would write them."""
    register_node(kube, name)
    found = [pb.Device(uuid=f"{name}-gpu{i}", vendor=vendor, model=model, index=i,
                       vram_bytes=80 * GiB, tflops_fp16=312, health_score=100,
                       health_state=pb.HEALTH_STATE_HEALTHY) for i in range(devices)]  # fmt: skip
    spec = node_spec(pb.Node(name=name, version="0.1.0"), found)
    created = kube.create("/apis/hcs.io/v1alpha1/computenodes", compute_node(name, spec))
    created["status"] = node_status(found, [], previous={}, now="2026-01-01T00:00:00Z")
    kube.request("PUT", f"/apis/hcs.io/v1alpha1/computenodes/{name}/status", body=created)
    kube.create("/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": f"hcs-node-{name}", "namespace": "hcs-system"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600,
                 "renewTime": micro_time(time.time())},
    })  # fmt: skip


def simulated_fleet(kube: Kube, names: Iterable[str], devices: int = 8) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: simulated_node(kube, name, devices), names))


@dataclass
class ExtenderProcess:
    """hcs-scheduler-extender as the manifests run it: mutual TLS for kube-scheduler, the
    Secret's key in a directory, probes and metrics on a plain port."""

    url: str
    probes: str

    def metric(self, name: str) -> float:
        """The sum of a metric's samples that start with `name` (labels included)."""
        text = subprocess.run(["curl", "-s", f"{self.probes}/metrics"],
                              capture_output=True, text=True, check=False).stdout  # fmt: skip
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name))  # fmt: skip


def start_extender(plane: ControlPlane, work: Path, key: bytes) -> ExtenderProcess:
    """Started, ready (its informers synced), and stopped with the plane's processes."""
    keys_dir = work / "extender-keys"
    keys_dir.mkdir(exist_ok=True)
    (keys_dir / "k1.key").write_bytes(key)
    (keys_dir / "k1.key").chmod(0o400)
    port, probes = free_port(), free_port()
    log = open(work / "extender.log", "ab")  # noqa: SIM115 - lives as long as the process
    plane.processes["extender"] = subprocess.Popen(
        [sys.executable, "-m", "hcsd.cluster.extender_cli", "--listen", f"127.0.0.1:{port}",
         "--probe-listen", f"127.0.0.1:{probes}", *plane.extender_tls(),
         "--keys-dir", str(keys_dir), "--kubeconfig", str(plane.config_for("extender"))],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    plane.wait_ready("extender", f"http://127.0.0.1:{probes}/readyz", 120)
    return ExtenderProcess(f"https://127.0.0.1:{port}/", f"http://127.0.0.1:{probes}")


def create_job(kube: Kube, namespace: str, job: str, count: int, limits: dict[str, str]) -> None:
    """The namespace (if new) and `count` pods labelled as one job, created by 8 threads."""
    try:
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": namespace}})  # fmt: skip
    except Exception as e:
        if not getattr(e, "conflict", False):
            raise

    def one(i: int) -> None:
        kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-{i:04d}", "labels": {JOB_LABEL: job}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": limits}}]},
        })  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def wait_bound(kube: Kube, namespace: str, count: int, timeout: float) -> float:
    """Block until `count` pods of the namespace are bound; the monotonic time the last one
    was seen bound. Follows one watch (a poll would load the API server while it is being
    measured). TimeoutError naming how many are left."""
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{namespace}/pods"
    items, version = kube.list_all(path)
    bound = {i["metadata"]["name"] for i in items if i["spec"].get("nodeName")}
    while len(bound) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{count - len(bound)} of {count} pods in {namespace} unbound")
        for event in kube.watch(path, version, timeout_seconds=max(1, int(left))):
            obj = event["object"]
            version = obj["metadata"].get("resourceVersion", version)
            if event["type"] in ("ADDED", "MODIFIED") and obj["spec"].get("nodeName"):
                bound.add(obj["metadata"]["name"])
                if len(bound) >= count:
                    break
    return time.monotonic()


def bookings(kube: Kube, namespace: str, keys: Keyring) -> dict[tuple[str, str], list[str]]:
    """(node, device uuid) -> the pods holding it, from every bound pod's assignment, each
    verified with its node's key (AssignmentError if one does not verify)."""
    held: dict[tuple[str, str], list[str]] = {}
    for pod in kube.list_all(f"/api/v1/namespaces/{namespace}/pods")[0]:
        meta, node = pod["metadata"], pod["spec"].get("nodeName")
        if not node:
            continue
        body = verify(meta["annotations"][ANNOTATION], derive(keys, node).keys, node=node,
                      pod_uid=meta["uid"], now=time.time(), max_age=3600)  # fmt: skip
        for grants in body.containers.values():
            for grant in grants:
                held.setdefault((node, grant.device_uuid), []).append(meta["name"])
    return held


def pod_nodes(kube: Kube, namespace: str) -> dict[str, Any]:
    """Pod name -> the node it is bound to ("" when not)."""
    items = kube.list_all(f"/api/v1/namespaces/{namespace}/pods")[0]
    return {i["metadata"]["name"]: i["spec"].get("nodeName") or "" for i in items}
