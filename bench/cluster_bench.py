"""The cluster side with the real control plane: scheduling throughput and API writes.

1. Pods scheduled per second by the real kube-scheduler at 1,000 nodes: 300 pods asking
   `ai.compute/vram: 8Gi` through hcs-scheduler-extender, against 300 plain pods (cpu only)
   through the same scheduler without the extender. Pods are created first and the scheduler
   started after, so the figure is the scheduler's, not the client's creation rate.
2. API writes per node per minute at steady state: three nodes with hcsd and hcs-syncer at
   their default timings, every write to their ComputeNodes and Leases counted from a watch
   for 60 s. Target: only the Lease, i.e. <= 6.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, write_result
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import compute_node, node_spec, node_status
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.keyring import Keyring
from tests.cluster.conftest import NODES, NodeDaemon, kustomized, node_file, secret_with
from tests.cluster.controlplane import ControlPlane, free_port, manifests, register_node
from tests.harness.peers.kubernetes import ensure_kubernetes, find_etcd

GiB = 2**30
NODE_COUNT = 1000
PODS = 300
WATCH_SECONDS = 60.0


def fake_fleet_node(kube: Kube, name: str) -> None:
    """A Node, its ComputeNode (8x A100 80G) and a fresh heartbeat, as a syncer would write."""
    register_node(kube, name)
    devices = [pb.Device(uuid=f"{name}-gpu{i}", vendor="nvidia", model="A100-SXM4-80GB", index=i,
                         vram_bytes=80 * GiB, tflops_fp16=312, health_score=100,
                         health_state=pb.HEALTH_STATE_HEALTHY) for i in range(8)]  # fmt: skip
    spec = node_spec(pb.Node(name=name, version="0.1.0"), devices)
    created = kube.create("/apis/hcs.io/v1alpha1/computenodes", compute_node(name, spec))
    created["status"] = node_status(devices, [], previous={}, now="2026-01-01T00:00:00Z")
    kube.request("PUT", f"/apis/hcs.io/v1alpha1/computenodes/{name}/status", body=created)
    now = micro_time(time.time())
    kube.create("/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": f"hcs-node-{name}", "namespace": "hcs-system"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600, "renewTime": now},
    })  # fmt: skip


def make_pods(kube: Kube, namespace: str, count: int, resources: dict[str, str]) -> None:
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip

    def one(i: int) -> None:
        kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:04d}"},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": resources}}]},
        })  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def time_to_bind(
    plane: ControlPlane, kube: Kube, namespace: str, extender_url: str | None
) -> float:
    plane.start_scheduler(extender_url, qps=1000)
    started = time.monotonic()
    while True:
        left = kube.get(f"/api/v1/namespaces/{namespace}/pods",
                        [("fieldSelector", "spec.nodeName=")]).get("items", [])  # fmt: skip
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > 600:
            raise RuntimeError(f"{len(left)} pods still unbound:\n{plane.tail('kube-scheduler')}")
        time.sleep(0.1)


def throughput(plane: ControlPlane, work: Path, key: bytes) -> dict[str, Any]:
    kube = plane.kube()
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: fake_fleet_node(kube, f"node-{i:04d}"), range(NODE_COUNT)))
    setup = time.monotonic() - started
    keys_dir = work / "keys"  # the Secret's volume: one key, which signs
    keys_dir.mkdir(exist_ok=True)
    (keys_dir / "k1.key").write_bytes(key)
    (keys_dir / "k1.key").chmod(0o400)
    port, probes = free_port(), free_port()
    log = open(work / "extender.log", "ab")  # noqa: SIM115
    extender = subprocess.Popen(  # over mutual TLS with kube-scheduler, as the manifests ship it
        [sys.executable, "-m", "hcsd.cluster.extender_cli", "--listen", f"127.0.0.1:{port}",
         "--probe-listen", f"127.0.0.1:{probes}", *plane.extender_tls(),
         "--keys-dir", str(keys_dir), "--kubeconfig", str(plane.config_for("extender"))],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    plane.processes["extender"] = extender
    try:
        make_pods(kube, "with-extender", PODS, {"ai.compute/vram": "8Gi"})
        plane.wait_ready("extender", f"http://127.0.0.1:{probes}/readyz", 120)
        with_extender = time_to_bind(plane, kube, "with-extender", f"https://127.0.0.1:{port}/")
        plane.stop_process("kube-scheduler")
        metrics = subprocess.run(["curl", "-s", f"http://127.0.0.1:{probes}/metrics"],
                                 capture_output=True, text=True, check=False).stdout  # fmt: skip
    finally:
        plane.stop_process("extender")
    make_pods(kube, "plain", PODS, {"cpu": "100m"})
    plain = time_to_bind(plane, kube, "plain", None)
    plane.stop_process("kube-scheduler")
    count = next((line.split()[-1] for line in metrics.splitlines()
                  if line.startswith("hcs_extender_scheduling_seconds_count")), "0")  # fmt: skip
    total = next((line.split()[-1] for line in metrics.splitlines()
                  if line.startswith("hcs_extender_scheduling_seconds_sum")), "0")  # fmt: skip
    return {
        "nodes": NODE_COUNT, "pods": PODS, "setup_seconds": round(setup, 1),
        "with_extender_pods_per_s": round(PODS / with_extender, 1),
        "plain_pods_per_s": round(PODS / plain, 1),
        "ratio_extender_to_plain": round(plain / with_extender, 3) if with_extender else None,
        "extender_mean_scheduling_ms": round(float(total) / max(float(count), 1) * 1000, 1),
    }  # fmt: skip


def steady_writes(plane: ControlPlane, work: Path) -> dict[str, Any]:
    kube = plane.kube()
    names = ["gpu-node", "mlu-node", "dcu-node"]
    daemons, syncers = [], []
    try:
        for name in names:
            directory = work / name
            directory.mkdir()
            prefix, devices, link = NODES[name]
            daemon = NodeDaemon(
                directory, name, node_file(directory / "node.toml", prefix, devices, link)
            )
            daemon.start()
            daemons.append(daemon)
            register_node(kube, name)
            syncers.append(subprocess.Popen(
                [sys.executable, "-m", "hcsd.cluster.syncer_cli", "--node-name", name,
                 "--socket", daemon.socket, "--kubeconfig", str(plane.config_for("syncer"))],
                stdout=open(work / f"syncer-{name}.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            ))  # fmt: skip
        time.sleep(15)  # first sync, Lease created, a renewal or so
        counts: dict[str, int] = {}
        stop = threading.Event()

        def count(path: str, kind: str) -> None:
            _, version = kube.list_all(path)
            watcher = Kube.connect(str(plane.config_for("admin")))
            for event in watcher.watch(path, version, timeout_seconds=int(WATCH_SECONDS) + 5):
                if stop.is_set():
                    return
                if event.get("type") in ("ADDED", "MODIFIED"):
                    name = event["object"]["metadata"]["name"]
                    counts[f"{kind}:{name}"] = counts.get(f"{kind}:{name}", 0) + 1

        leases = "/apis/coordination.k8s.io/v1/namespaces/hcs-system/leases"
        threads = [
            threading.Thread(target=count, args=(path, kind), daemon=True)
            for path, kind in (("/apis/hcs.io/v1alpha1/computenodes", "node"), (leases, "lease"))
        ]
        for t in threads:
            t.start()
        time.sleep(WATCH_SECONDS)
        stop.set()
        per_node = {
            name: {
                "lease": counts.get(f"lease:hcs-node-{name}", 0),
                "computenode": counts.get(f"node:{name}", 0),
            }
            for name in names
        }
    finally:
        for process in syncers:
            process.kill()
            process.wait()
        for daemon in daemons:
            daemon.close()
    worst = max(v["lease"] + v["computenode"] for v in per_node.values())
    return {"seconds": WATCH_SECONDS, "writes_per_node": per_node,
            "max_writes_per_node_per_minute": round(worst * 60 / WATCH_SECONDS, 1)}  # fmt: skip


def main() -> dict[str, Any]:
    binaries, etcd = ensure_kubernetes(), find_etcd()
    if isinstance(binaries, str) or isinstance(etcd, str):
        reason = binaries if isinstance(binaries, str) else etcd
        print(f"SKIP cluster benchmark: {reason}")
        return {"skipped": str(reason)}
    with tempfile.TemporaryDirectory(prefix="hcs-cluster-bench-") as tmp:
        work = Path(tmp)
        plane = ControlPlane(binaries, etcd, work).start()
        key = secrets.token_hex(32).encode()
        try:
            shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
            plane.apply(shipped + secret_with(Keyring({"k1": key}, "k1")))
            writes = steady_writes(plane, work)
            rate = throughput(plane, work, key)
        finally:
            plane.stop()
    leases = sum(w["lease"] for w in writes["writes_per_node"].values())
    if not leases:  # no renewal at all: the syncers did not run, nothing was measured
        print("VOID steady-state writes: no Lease was renewed (see the syncer logs)")
    met = writes["max_writes_per_node_per_minute"] <= 6 if leases else None
    out = {"throughput": rate, "steady_state_writes": writes, "meets_target": met}
    print(json.dumps(out, indent=2))
    write_result("cluster", out)
    return out


if __name__ == "__main__":
    main()
