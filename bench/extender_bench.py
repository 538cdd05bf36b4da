"""Extender filter+prioritize latency for one pod at 100, 1,000 and 5,000 ComputeNodes.

The extender runs in its own process with its real HTTP server and decision code; its
caches are filled with ComputeNode objects built by the syncer's own functions (a mixed
fleet: 8x A100, 8x 910B, 4x MLU370, 8x Z100 nodes, with random allocations), so no API server
is needed to measure the decision. A ComputeNode update arrives every 10 ms (100 a second, as
at 100 binds a second): a random node's object with one device's usage changed, decoded,
turned into a NodeView and applied as the informer does; and every node's heartbeat Lease
is renewed at the syncer's rate (a quarter of its 40 s duration: 500 renewals a second at
5,000 nodes), so caches and snapshots are invalidated as in a real cluster.
Pods of one job ask the same thing, so an unchanged node answers a demand it has seen from a
cache; the `*-new-size-each-pod` cases show the cold cost (a demand never seen, every pod).
Each sample is what kube-scheduler waits for: POST /filter with every node name, then
POST /prioritize with the names that passed. The filter body is encoded before the clock
starts; the prioritize body's encoding and the decoding of both answers (orjson, a small
share at these sizes) are inside it. Targets at 5,000 nodes: p99 <
10 ms for every case, < 5 ms where the demand repeats (pods of one job).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, summary_us, write_result
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.commands import tune_gc
from hcsd.cluster.extender import Extender
from hcsd.cluster.heartbeats import NodeLease
from hcsd.cluster.http import serve
from hcsd.cluster.kube import Kube
from hcsd.cluster.objects import compute_node, node_spec, node_status, node_view
from hcsd.cluster.timefmt import micro_time
from hcsd.contract.keyring import Keyring
from hcsd.contract.names import NAMESPACE, NODE_LEASE_PREFIX
from hcsd.profiles.database import ProfileDatabase

GiB = 2**30
SIZES = (100, 1000, 5000)
SAMPLES = 300
CHURN_SECONDS = 0.01  # 100 ComputeNode updates a second, as at 100 binds a second
LEASE_SECONDS = 40.0  # the syncer's Lease duration; it renews every quarter of it
TARGET_P99_MS = 10.0  # every case
TARGET_REPEATED_P99_MS = 5.0  # the cases whose demand repeats
FLEET = [  # (share, vendor, model, count, vram GiB, tflops, link kind, GB/s)
    (0.50, "nvidia", "A100-SXM4-80GB", 8, 80, 312.0, "nvlink", 300.0),
    (0.25, "ascend", "Ascend910B3", 8, 64, 313.0, "hccs", 56.0),
    (0.15, "cambricon", "MLU370-X8", 4, 48, 96.0, "mlulink", 100.0),
    (0.10, "hygon", "Z100", 8, 32, 24.5, "xgmi", 92.0),
]


def node_object(name: str, rng: random.Random, devices: int = 0) -> dict[str, Any]:
    """A node of the mixed fleet; `devices`: that many of its model instead of the fleet's
    count, linked in a ring (each to its two neighbours) rather than all to all."""
    pick, acc = rng.random(), 0.0
    chosen = FLEET[-1]
    for entry in FLEET:
        acc += entry[0]
        if pick <= acc:
            chosen = entry
            break
    _, vendor, model, count, vram, tflops, kind, gbps = chosen
    count = devices or count
    uuids = [f"{name}-{i}" for i in range(count)]
    devices, allocations = [], []
    for i, device_uuid in enumerate(uuids):
        used = (
            rng.choice([0, 0, 0, 8, 16, 24, 40]) * GiB if vram >= 40 else rng.choice([0, 8]) * GiB
        )
        devices.append(pb.Device(
            uuid=device_uuid, vendor=vendor, model=model, index=i, vram_bytes=vram * GiB,
            tflops_fp16=tflops, health_score=rng.choice([100] * 9 + [70]),
            health_state=pb.HEALTH_STATE_HEALTHY, vram_allocated_bytes=used,
            links=[pb.Link(peer_uuid=p, kind=kind, gbps=gbps) for p in uuids
                   if p != device_uuid and (not devices or p in ring(uuids, i))],
        ))  # fmt: skip
        if used:
            allocations.append(pb.Allocation(
                container_id=f"{device_uuid}-c", pod=pb.PodRef(namespace="team", name="x",
                                                                uid=f"{device_uuid}-pod"),
                container_name="main", grants=[pb.Grant(device_uuid=device_uuid, vram_bytes=used)],
                source="assignment"))  # fmt: skip
    obj = compute_node(name, node_spec(pb.Node(name=name, version="0.1.0"), devices))
    obj["status"] = node_status(devices, allocations, previous={}, now="2026-01-01T00:00:00Z")
    obj["metadata"]["resourceVersion"] = str(rng.randrange(10**9))
    return obj


def ring(uuids: list[str], i: int) -> tuple[str, str]:
    return uuids[i - 1], uuids[(i + 1) % len(uuids)]


def pod(limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """A pod as kube-scheduler sends it (the full object, a few KiB)."""
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "trainer", "namespace": "team", "uid": str(uuid.uuid4()),
                     "annotations": annotations, "labels": {"app": "trainer"},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                 "resources": {"limits": limits, "requests": limits},
                                 "env": [{"name": f"E{i}", "value": "x" * 40} for i in range(20)]}],
                 "schedulerName": "default-scheduler", "restartPolicy": "Never"},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def post(connection: http.client.HTTPConnection, verb: str, payload: bytes) -> Any:
    connection.request("POST", f"/{verb}", payload, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, data[:300]
    return orjson.loads(data)


CASES = {
    "vram-16Gi": ({"ai.compute/vram": "16Gi"}, {}),
    # A VRAM size never asked before on every pod: no per-node answer can be reused.
    "vram-new-size-each-pod": ({"ai.compute/vram": "NEW"}, {}),
    "vram-new-size-each-pod-pinned": ({"ai.compute/vram": "NEW"},
                                      {"hcs.io/models": "A100-SXM4-80GB,Ascend910B3"}),
    "vram-24Gi-vendor-pinned": ({"ai.compute/vram": "24Gi"}, {"hcs.io/vendors": "ascend"}),
    "tflops-100": ({"ai.compute/tflops-fp16": "100"}, {}),
    "2-devices-linked": ({"ai.compute/devices": "2"},
                         {"hcs.io/topology-preference": "high-bandwidth"}),
    "tflops-200-substitution": ({"ai.compute/tflops-fp16": "200"},
                                {"hcs.io/models": "A100", "hcs.io/allow-substitution": "true"}),
}  # fmt: skip
NEW_EACH_POD = [case for case, (limits, _) in CASES.items() if "NEW" in limits.values()]


def serve_fleet(size: int, devices: int = 0) -> None:
    """The extender process: a fleet of `size` nodes, one of which changes every 10 ms."""
    rng = random.Random(size)
    extender = Extender(
        Kube.__new__(Kube), lambda: Keyring({"k": b"k" * 32}, "k"), ProfileDatabase.load(None)
    )
    names = [f"node-{i:05d}" for i in range(size)]
    stored = []  # each node's object as the API server would send it
    for name in names:
        obj = node_object(name, rng, devices)
        stored.append(json.dumps(obj))
        extender.state.nodes.apply(name, node_view(obj))
    for name in names:  # after the (slow) build, so no Lease starts the run half aged
        renew(extender, name)
    extender.state.snapshot()  # as hcs-scheduler-extender does once its caches are synced
    tune_gc()
    server = serve(extender, "127.0.0.1", 0)
    print(server.server_address[1], flush=True)

    def churn() -> None:
        """What the ComputeNode informer does per event: decode the object, make its
        NodeView; the object is a random node's, with one device's usage changed."""
        while True:
            time.sleep(CHURN_SECONDS)
            changed = json.loads(rng.choice(stored))
            with_fresh_usage(changed, rng)
            extender.state.nodes.apply(changed["metadata"]["name"], node_view(changed))

    def renewals() -> None:
        """Every node's Lease renewed once per quarter of its duration, spread evenly."""
        per_tick = max(1, round(len(names) * CHURN_SECONDS / (LEASE_SECONDS / 4)))
        turn = 0
        while True:
            time.sleep(CHURN_SECONDS)
            for _ in range(per_tick):
                renew(extender, names[turn % len(names)])
                turn += 1

    threading.Thread(target=churn, daemon=True).start()
    threading.Thread(target=renewals, daemon=True).start()
    server.serve_forever()


def renew(extender: Extender, name: str) -> None:
    """The node's heartbeat Lease renewed now, as the leases informer delivers it."""
    lease = NodeLease(name, micro_time(time.time()), LEASE_SECONDS)
    extender.state.leases.apply(f"{NAMESPACE}/{NODE_LEASE_PREFIX}{name}", lease)


def with_fresh_usage(obj: dict[str, Any], rng: random.Random) -> None:
    """One device of the ComputeNode now holds a different amount (or nothing)."""
    device = rng.choice(obj["spec"]["devices"])
    status = obj["status"]
    allocations = [
        a for a in status.get("allocations") or () if a["grants"][0]["uuid"] != device["uuid"]
    ]
    gib = rng.choice([0, 8, 16, 24]) if device["vramBytes"] >= 40 * GiB else rng.choice([0, 8])
    if gib:
        allocations.append({
            "podUID": f"{device['uuid']}-pod{rng.randrange(10**6)}", "namespace": "team",
            "container": "main", "grants": [{"uuid": device["uuid"], "vramBytes": gib * GiB}],
        })  # fmt: skip
    status["allocations"] = allocations
    obj["metadata"]["resourceVersion"] = str(rng.randrange(10**9))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    size: int,
    rng: random.Random,
    cases: dict[str, tuple[dict[str, str], dict[str, str]]] = CASES,
    *,
    samples: int = SAMPLES,
    devices: int = 0,
) -> dict[str, Any]:
    """p50/p99 of filter+prioritize per case against a fresh extender of `size` nodes, and
    the extender's CPU time per pod (its churn's share, measured idle first, taken out): on a
    machine shared with other work the wall times wait for the CPU, the CPU time much less."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.extender_bench", "--serve", str(size), str(devices)],
        stdout=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None
    port = int(process.stdout.readline())
    names = [f"node-{i:05d}" for i in range(size)]
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's client does
    result: dict[str, Any] = {"nodes": size}
    try:
        churn_started, churn_cpu = time.perf_counter(), cpu_seconds(process.pid)
        time.sleep(2.0)
        churn_rate = (cpu_seconds(process.pid) - churn_cpu) / (time.perf_counter() - churn_started)
        for case, (limits, annotations) in cases.items():
            taken, passed_counts = [], []
            cpu_from = wall_from = 0.0
            for i in range(samples + 20):
                if i == 20:  # after the warm-up
                    cpu_from, wall_from = cpu_seconds(process.pid), time.perf_counter()
                asked = dict(limits)
                if asked.get("ai.compute/vram") == "NEW":
                    asked["ai.compute/vram"] = f"{rng.randrange(1024, 40 * 1024)}Mi"
                body = pod(asked, annotations)
                filter_body = orjson.dumps({"Pod": body, "NodeNames": names})
                started = time.perf_counter()
                answer = post(connection, "filter", filter_body)
                prioritize_body = orjson.dumps({"Pod": body, "NodeNames": answer["NodeNames"]})
                post(connection, "prioritize", prioritize_body)
                elapsed = time.perf_counter() - started
                if i >= 20:  # warm-up
                    taken.append(elapsed)
                    passed_counts.append(len(answer["NodeNames"]))
            cpu = cpu_seconds(process.pid) - cpu_from
            cpu -= churn_rate * (time.perf_counter() - wall_from)
            stats = summary_us(taken)
            result[case] = {
                "p50_ms": round(stats["p50_us"] / 1000, 2),
                "p99_ms": round(stats["p99_us"] / 1000, 2),
                "extender_cpu_ms_per_pod": round(max(cpu, 0.0) / samples * 1000, 2),
                "nodes_passing_median": sorted(passed_counts)[len(passed_counts) // 2],
            }
    finally:
        connection.close()
        process.kill()
        process.wait()
    return result


def main() -> dict[str, Any]:
    rng = random.Random(42)
    rows = [measure(size, rng) for size in SIZES]
    largest = rows[-1]
    repeated = [case for case in CASES if case not in NEW_EACH_POD]
    worst = max(largest[case]["p99_ms"] for case in repeated)
    cold = max(largest[case]["p99_ms"] for case in NEW_EACH_POD)
    out = {"samples_per_case": SAMPLES, "results": rows,
           "target_p99_ms_at_5000": TARGET_P99_MS,
           "target_p99_ms_at_5000_repeated_demand": TARGET_REPEATED_P99_MS,
           "worst_p99_ms_at_5000_repeated_demand": worst,
           "worst_p99_ms_at_5000_new_demand_every_pod": cold,
           "meets_target_repeated_demand": worst < TARGET_REPEATED_P99_MS,
           "meets_target_new_demand_every_pod": cold < TARGET_P99_MS,
           "meets_target": worst < TARGET_REPEATED_P99_MS and cold < TARGET_P99_MS}  # fmt: skip
    for row in rows:
        for case in CASES:
            print(
                f"extender {row['nodes']:>5} nodes  {case:<32} p50 {row[case]['p50_ms']:>6} ms"
                f"  p99 {row[case]['p99_ms']:>6} ms"
                f"  extender CPU {row[case]['extender_cpu_ms_per_pod']:>5} ms/pod"
            )
    print(
        f"p99 at 5000 nodes, pods of a job (worst case): {worst} ms "
        f"(target < {TARGET_REPEATED_P99_MS} ms)"
    )
    print(f"p99 at 5000 nodes, a new demand every pod: {cold} ms (target < {TARGET_P99_MS} ms)")
    write_result("extender", out)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve_fleet(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
