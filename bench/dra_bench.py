"""Scheduling through DRA vs through the extender vs plain pods, at 100 and 1,000 fake nodes.

One real control plane (etcd, kube-apiserver, kube-scheduler 1.36, kube-controller-manager
with only its resource-claim controller) and fake Nodes (no kubelets). Every node is a GPU
node of 8 x A100-SXM4-80GB on one NVLink island, offered both ways: its ComputeNode and
heartbeat Lease as hcs-syncer writes them in extender mode (tests/cluster/jobs.py), and its
ResourceSlice as hcs-syncer writes it in DRA mode (hcsd.cluster.dra_slices, from the same
device records). The shipped DeviceClasses (packaging/kubernetes-dra/dra.yaml) are applied.
Each mode only ever reaches its own side: the extender runs only for its pods, and DRA pods
ask no extended resource.

Per size (100 nodes, then 900 more added) and mode, a burst of PODS pods is created by 8
threads while kube-scheduler runs:
- plain: cpu/memory requests only, the default kube-scheduler;
- extender: `ai.compute/vram: 16Gi`, kube-scheduler with hcs-scheduler-extender (the shipped
  extender configuration, mutual TLS, the extender binds);
- dra: the same request as the webhook turns it into (hcsd.cluster.webhook_dra.dra_patch,
  its template made through claim_templates): a ResourceClaimTemplate reference, the claim
  made by kube-controller-manager and allocated by the default kube-scheduler; twice, with
  kube-controller-manager's client at the scheduler's rate (dra) and at its defaults
  (dra-kcm-default), since its resource-claim controller writes twice per pod.
Then PACED pods one every PACE_SECONDS into the idle scheduler: the path's latency, no queue.

kube-scheduler's client runs at the same QPS and burst in every mode (SCHEDULER_QPS). Times
are the bench's monotonic clock: a pod's creation is when its POST is sent, its bind when
one watch on the namespace (opened before the batch) first shows its `nodeName`; the API
server's timestamps have whole seconds only. Throughput is pods bound over the seconds from
the first POST to the last bind. Prints a table, writes bench/out/dra.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster_bench import cpu_seconds
from bench.common import percentile, write_result
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.claim_templates import Templates
from hcsd.cluster.dra_slices import resource_slice, slice_spec
from hcsd.cluster.kube import Kube
from hcsd.cluster.webhook_dra import dra_patch
from hcsd.contract.keyring import Keyring
from tests.cluster.conftest import kustomized, secret_with
from tests.cluster.controlplane import CLIENTS, CONTROLLER_MANAGER, REPO, ControlPlane, manifests
from tests.cluster.jobs import simulated_node, start_extender
from tests.harness.peers.kubernetes import (
    KUBERNETES_VERSION,
    ensure_controller_manager,
    ensure_kubernetes,
    find_etcd,
)
from tests.unit.test_webhook_dra import apply as apply_patch

SIZES = (100, 1000)
PODS = 500
DEVICES_PER_NODE = 8  # a GPU node: 8 x A100 80G on NVLink, as the extender's fleet has
SCHEDULER_QPS = 1000  # kube-scheduler's client QPS in every mode; its burst is twice that
CREATORS = 8  # threads creating the burst
PACED = 60  # then pods one at a time, every PACE_SECONDS (below every mode's throughput)
PACE_SECONDS = 0.2
#: kube-controller-manager's client (--kube-api-qps, --kube-api-burst): its resource-claim
#: controller writes each DRA pod's claim and the pod's claim status. "dra" runs it at the
#: scheduler's rate; "dra-kcm-default" at the binary's defaults, 20 and 30, which kubeadm and
#: many clusters keep.
KCM_QPS = {"dra": (SCHEDULER_QPS, 2 * SCHEDULER_QPS), "dra-kcm-default": (20, 30)}
MODES = ("plain", "extender", "dra", "dra-kcm-default")
LIMITS = {
    "plain": {"cpu": "100m", "memory": "128Mi"},
    "extender": {"ai.compute/vram": "16Gi"},
    "dra": {"ai.compute/vram": "16Gi"},
    "dra-kcm-default": {"ai.compute/vram": "16Gi"},
}
RESOURCE = "/apis/resource.k8s.io/v1"
GiB = 2**30


def gpu_devices(node: str) -> list[pb.Device]:
    """The device records hcsd would report for `node`: 8 A100s, every pair on NVLink."""
    uuids = [f"{node}-gpu{i}" for i in range(DEVICES_PER_NODE)]
    return [
        pb.Device(uuid=uuid, vendor="nvidia", model="A100-SXM4-80GB", index=i,
                  vram_bytes=80 * GiB, tflops_fp16=312, health_score=100,
                  health_state=pb.HEALTH_STATE_HEALTHY, pci_bus_id=f"0000:{0x17 + i:02x}:00.0",
                  links=[pb.Link(peer_uuid=p, kind="nvlink", gbps=300) for p in uuids if p != uuid])
        for i, uuid in enumerate(uuids)
    ]  # fmt: skip


def add_nodes(kube: Kube, names: list[str]) -> None:
    """Node, ComputeNode, Lease (extender mode) and ResourceSlice (DRA mode) per node."""

    def one(name: str) -> None:
        simulated_node(kube, name, DEVICES_PER_NODE)
        spec = slice_spec(name, gpu_devices(name), generation=1)
        kube.create(f"{RESOURCE}/resourceslices", resource_slice(name, spec))

    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(one, names))


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses `mode: dra` installs, as rendered from the chart."""
    text = (REPO / "packaging" / "kubernetes-dra" / "dra.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d and d["kind"] == "DeviceClass"]


def pod_body(name: str, mode: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
    """One pod of the batch; in DRA mode as the webhook patches it (`patch`)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": dict(LIMITS[mode])}}]},
    }  # fmt: skip
    return apply_patch(pod, patch) if patch else pod


def claim_patch(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The webhook's patch for the DRA batch's shape, its template made in `namespace` (every
    pod of one shape gets the same patch, so the webhook's work is done once, not timed)."""
    outcome = dra_patch(pod_body("shape", "dra", []), namespace, Templates(kube).ensure)
    return outcome.patch


def summarize(created: dict[str, float], bound: dict[str, float]) -> dict[str, Any]:
    """Throughput and creation-to-bound latency of a batch from the bench's clock readings:
    `created` pod -> when its POST was sent, `bound` pod -> when it was first seen bound."""
    latencies = [bound[name] - created[name] for name in created if name in bound]
    if not latencies:
        return {"pods": len(created), "bound": 0}
    span = max(bound[name] for name in created if name in bound) - min(created.values())
    return {
        "pods": len(created),
        "bound": len(latencies),
        "seconds": round(span, 2),
        "pods_per_s": round(len(latencies) / span, 1),
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
    }


class BoundWatch(threading.Thread):
    """One watch on a namespace's pods: when each was first seen with a nodeName."""

    def __init__(self, config: Path, namespace: str) -> None:
        super().__init__(daemon=True)
        self.kube = Kube.connect(str(config))
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.version = self.kube.list_all(self.path)[1]
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for event in self.kube.watch(self.path, self.version, timeout_seconds=30):
                obj = event["object"]
                self.version = obj["metadata"].get("resourceVersion", self.version)
                name = obj["metadata"].get("name", "")
                if obj.get("spec", {}).get("nodeName") and name not in self.bound:
                    self.bound[name] = time.monotonic()
                if self.stop.is_set():
                    break

    def wait(self, names: list[str], timeout: float) -> None:
        """Until every one of `names` is bound, or `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while any(n not in self.bound for n in names) and time.monotonic() < deadline:
            time.sleep(0.05)


def run_batch(
    plane: ControlPlane, mode: str, nodes: int, pods: int, url: str | None
) -> dict[str, Any]:
    """One mode's burst and paced pods at one size, kube-scheduler started for them and
    stopped after."""
    kube = plane.kube()
    namespace = f"{mode}-{nodes}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip
    patch = claim_patch(kube, namespace) if mode in KCM_QPS else []
    # Claims of earlier batches still allocated (their pods are deleted; the resource-claim
    # controller deletes a pod's generated claim after it): they would crowd the devices.
    claims = kube.list_all(f"{RESOURCE}/resourceclaims")[0]
    held = sum(1 for c in claims if (c.get("status") or {}).get("allocation"))
    plane.start_scheduler(url, qps=SCHEDULER_QPS)
    watch = BoundWatch(plane.config_for("admin"), namespace)
    watch.start()
    created: dict[str, float] = {}
    before = cpu_seconds(plane)

    def one(name: str) -> None:
        created[name] = time.monotonic()
        kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_body(name, mode, patch))

    burst = [f"p{i:04d}" for i in range(pods)]
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(one, burst))
    created_by = time.monotonic()
    watch.wait(burst, timeout=300)
    after = cpu_seconds(plane)
    # Then one pod every PACE_SECONDS into the idle scheduler: the path's own latency.
    paced = [f"s{i:04d}" for i in range(PACED)]
    start = time.monotonic()
    for i, name in enumerate(paced):
        time.sleep(max(0.0, start + i * PACE_SECONDS - time.monotonic()))
        one(name)
    watch.wait(paced, timeout=120)
    watch.stop.set()
    plane.stop_process("kube-scheduler")
    bound = dict(watch.bound)
    result = summarize({n: created[n] for n in burst}, bound)
    result["create_seconds"] = round(created_by - min(created.values()), 2)
    result["cpu_ms_per_pod"] = {name: round((after[name] - before[name]) / pods * 1000, 2)
                                for name in before}  # fmt: skip
    result["paced"] = summarize({n: created[n] for n in paced}, bound)
    result["claims_allocated_before"] = held
    if len(bound) < pods + PACED:
        result["scheduler_log"] = plane.tail("kube-scheduler", 10)
    # The pods go (no kubelet to wait for), so the next batch meets an empty cluster.
    now = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", body=now)
    kube.close()
    return {"mode": mode, "nodes": nodes, **result}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'':22} {'burst':-^40}  {'paced':-^17}",
             f"{'nodes':>6} {'mode':<15} {'pods':>5} {'pods/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'create s':>8}  {'p50 ms':>8} {'p99 ms':>8}"]  # fmt: skip
    for r in rows:
        paced = r.get("paced") or {}
        lines.append(
            f"{r['nodes']:>6} {r['mode']:<15} {r['bound']:>5} {r.get('pods_per_s', '-'):>7} "
            f"{r.get('p50_ms', '-'):>8} {r.get('p99_ms', '-'):>8} {r.get('create_seconds', '-'):>8}"
            f"  {paced.get('p50_ms', '-'):>8} {paced.get('p99_ms', '-'):>8}"
        )
    return "\n".join(lines)


def claim_controller(plane: ControlPlane, manager: Path, qps: tuple[int, int]) -> None:
    """(Re)start kube-controller-manager with only the resource-claim controller (no
    node-lifecycle controller to taint kubelet-less nodes unreachable mid-batch), its client
    at `qps` (QPS, burst)."""
    plane.stop_process("kube-controller-manager")
    plane.start_controller_manager(manager, controllers="resourceclaim-controller",
                                   args=[f"--kube-api-qps={qps[0]}",
                                         f"--kube-api-burst={qps[1]}"])  # fmt: skip


def measure(
    plane: ControlPlane, work: Path, key: bytes, manager: Path, sizes: tuple[int, ...], pods: int
) -> dict[str, Any]:
    kube = plane.kube()
    for doc in device_classes():
        kube.create(f"{RESOURCE}/deviceclasses", doc)
    rows, setup, have = [], {}, 0
    for size in sizes:
        started = time.monotonic()
        add_nodes(kube, [f"node-{i:04d}" for i in range(have, size)])
        setup[size], have = round(time.monotonic() - started, 1), size
        for mode in MODES:
            url = None
            if mode in KCM_QPS:
                claim_controller(plane, manager, KCM_QPS[mode])
            if mode == "extender":
                url = start_extender(plane, work, key).url
            try:
                rows.append(run_batch(plane, mode, size, pods, url))
            finally:
                plane.stop_process("extender")
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    kube.close()
    return {"rows": rows, "setup_seconds": setup}


def main(sizes: tuple[int, ...] = SIZES, pods: int = PODS) -> dict[str, Any]:
    binaries, etcd = ensure_kubernetes(), find_etcd()
    manager = ensure_controller_manager()
    for reason in (binaries, etcd, manager):
        if isinstance(reason, str):
            print(f"SKIP DRA benchmark: {reason}")
            return {"skipped": reason}
    assert not isinstance(binaries, str) and not isinstance(etcd, str)
    assert not isinstance(manager, str)
    with tempfile.TemporaryDirectory(prefix="hcs-dra-bench-") as tmp:
        work = Path(tmp)
        plane = ControlPlane(binaries, etcd, work, clients=CLIENTS | CONTROLLER_MANAGER).start()
        key = secrets.token_hex(32).encode()
        try:
            shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
            plane.apply(shipped + secret_with(Keyring({"k1": key}, "k1")))
            measured = measure(plane, work, key, manager, sizes, pods)
            config = yaml.safe_load((work / "scheduler-config.yaml").read_text())
            client = {k: v for k, v in config["clientConnection"].items() if k != "kubeconfig"}
        finally:
            plane.stop()
    managers = {mode: {"qps": q, "burst": b} for mode, (q, b) in KCM_QPS.items()}
    out: dict[str, Any] = {
        "pods_per_batch": pods,
        "devices_per_node": DEVICES_PER_NODE,
        "creator_threads": CREATORS,
        "paced": {"pods": PACED, "every_seconds": PACE_SECONDS},
        "kube_scheduler": {
            "version": KUBERNETES_VERSION,
            "client_connection": client,
            "profiles": "default (DynamicResources on), percentageOfNodesToScore unset",
        },
        "kube_controller_manager": managers,
        **measured,
    }
    print(table(measured["rows"]))
    print(json.dumps({"kube_scheduler": out["kube_scheduler"]}))
    write_result("dra", out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="node counts, ascending (default: %(default)s)")  # fmt: skip
    parser.add_argument("--pods", type=int, default=PODS, help="pods per batch")
    args = parser.parse_args()
    main(tuple(int(s) for s in args.sizes.split(",")), args.pods)
