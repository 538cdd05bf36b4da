"""Self-healing end to end on the real kubelets (issue 18): a device fails or slows down under
a running workload, and HCS takes it out and the work goes on elsewhere.

The cluster (tests/harness/kubecluster/healing.py): `heal-gpu` (a simulated A100) and
`heal-npu` (a simulated Ascend 910B3), hcsd watching the kernel through eBPF, hcs-controller
running as its service account, kube-controller-manager's Job controller.

1. A fatal Xid for the A100, written to /dev/kmsg: hcsd marks it unhealthy, hcs-controller
   evicts the Job's pod (DisruptionTarget, reason HCSDeviceFailed) and taints the node; the
   Job's replacement runs on the Ascend node (the pod allows substitution) and is told the
   newest complete checkpoint (HCS_RESUME_FROM), not a newer incomplete one; after hcsd's
   quiet period the device is healthy and the taint goes.
2. The Ascend card's PCIe link down-trains (x8 of x16 in the node's fake sysfs) for longer
   than the sub-health hold: hcsd marks it degraded (`pcie-link-width`), the extender scores
   it down (a new pod goes to the A100), and hcs-controller with `--isolate-degraded`
   evicts its pod (reason HCSDeviceDegraded); the link back at x16, it recovers.

The figures (kernel line -> device unhealthy -> pod evicted -> replacement running) are
printed; docs/cluster.md, "Self-healing end to end", records them.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hcsd.api.client import Client
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube
from hcsd.contract.names import TAINT_UNHEALTHY
from tests.harness.kubecluster import healing, jobs, pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.healing import GPU, NPU

pytestmark = pytest.mark.slow

JOB = "heal-train"
CN = "/apis/hcs.io/v1alpha1/computenodes"
# A training loop: one step a second, each saved as step-N/ with its COMPLETE marker written
# last; from HCS_RESUME_FROM when hcsd gave one (the step number is in the checkpoint).
# Stopped, it fails (jobs.STOPPED) so that the Job replaces it; /tmp/finish ends it.
TRAIN = (
    f"{jobs.STOPPED}; "
    'echo "resume: status=$HCS_RESUME_STATUS from=$HCS_RESUME_FROM"; n=0; '
    'if [ -n "$HCS_RESUME_FROM" ]; then n=$(cat "$HCS_RESUME_FROM/step"); fi; '
    "while [ ! -e /tmp/finish ]; do n=$((n+1)); mkdir -p /ckpt/step-$n; "
    "echo $n > /ckpt/step-$n/step; : > /ckpt/step-$n/COMPLETE; echo saved step-$n; "
    "sleep 1 & wait; done; echo finished"
)


def wait(what: str, check: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def taint(kube: Kube, node: str) -> dict[str, Any] | None:
    spec = kube.get(f"/api/v1/nodes/{node}").get("spec") or {}
    return next((t for t in spec.get("taints") or [] if t["key"] == TAINT_UNHEALTHY), None)


def device_status(kube: Kube, node: str, uuid: str) -> dict[str, Any]:
    status = kube.get(f"{CN}/{node}").get("status") or {}
    return next((d for d in status.get("devices") or [] if d.get("uuid") == uuid), {})


def complete_steps(directory: Path) -> list[int]:
    return sorted(
        int(d.name.removeprefix("step-"))
        for d in directory.glob("step-*")
        if (d / "COMPLETE").is_file()
    )


def events(kube: Kube, kind: str, name: str) -> set[str]:
    """The reasons of the Events about object `kind`/`name` (a pod, a ComputeNode)."""
    found = kube.get(
        "/api/v1/events",
        query=[("fieldSelector", f"involvedObject.kind={kind},involvedObject.name={name}")],
    )
    return {str(e.get("reason")) for e in found.get("items") or []}


def wait_events(kube: Kube, kind: str, name: str, reasons: set[str]) -> None:
    """Wait for Events with these reasons about `kind`/`name`: the controller posts them after
    acting (the Evicted one after the eviction, which follows the DisruptionTarget condition
    a test may have just seen), so one read right after the action can miss them."""
    wait(f"{kind} {name}'s events {sorted(reasons)}",
         lambda: reasons <= events(kube, kind, name), 10, 0.1)  # fmt: skip


def controller_metric(cluster: KubeletCluster, sample: str, **labels: str) -> float:
    """A sample of hcs-controller's /metrics with these labels (0 when absent)."""
    url = f"http://127.0.0.1:{cluster.controller_probes}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == sample and found.labels == labels:
                return float(found.value)
    return 0.0


def logs(cluster: KubeletCluster, pod: str) -> list[str]:
    return cluster.kubectl("logs", pod, check=False).splitlines()


def report(title: str, times: dict[str, float]) -> None:
    print(f"{title}: " + ", ".join(f"{what} {seconds:.3f} s" for what, seconds in times.items()))


def test_a_failed_device_is_isolated_and_its_job_resumes_on_the_other_node(
    healing_kubelet_cluster: KubeletCluster, kmsg_writer: Any, tmp_path: Path
) -> None:
    cluster = healing_kubelet_cluster
    kube = cluster.kube
    gpu = cluster.nodes[GPU].vendor
    hcsd = cluster.nodes[GPU].hcsd
    assert hcsd is not None
    # Private to the test; both nodes' mount namespaces see the host's file systems (only
    # their own directories are bound over), so the replacement on the other node finds it.
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    spec = pods.PodSpec(
        JOB,
        command=TRAIN,
        annotations=(
            ("hcs.io/models", gpu.model),
            ("hcs.io/allow-substitution", "true"),  # the Ascend node when the A100 is out
            ("hcs.io/checkpoint-path", "/ckpt"),
        ),
        volumes=(pods.HostVolume("ckpt", checkpoints, "/ckpt"),),
    )
    times: dict[str, float] = {}
    jobs.create(kube, jobs.manifest(JOB, spec))
    watch = healing.HealthWatch(hcsd.socket, gpu.uuid)
    try:
        first = jobs.wait_running_pod(kube, JOB)
        name = str(first["metadata"]["name"])
        assert first["spec"]["nodeName"] == GPU, "the named model's node first"
        wait("three saved steps", lambda: "saved step-3" in logs(cluster, name), 30, 0.2)
        assert "resume: status=none from=" in logs(cluster, name)

        fault = time.monotonic()
        kmsg_writer(healing.xid_line(gpu.pci_bus_id))
        unhealthy, attributes = watch.wait(pb.HEALTH_STATE_UNHEALTHY, fault, 5)
        times["kernel line -> device unhealthy (hcsd API)"] = unhealthy - fault
        assert unhealthy - fault < 1.0, "sub-second detection"
        assert attributes.get("health_cause") == "xid-79 (fatal)", attributes
        wait(
            "the ComputeNode to say unhealthy",
            lambda: device_status(kube, GPU, gpu.uuid).get("health") == "unhealthy",
            10,
        )
        times["-> ComputeNode unhealthy"] = time.monotonic() - fault

        def disrupted() -> dict[str, Any]:
            pod = pods.get(kube, name) or {}
            condition = pods.condition(pod, "DisruptionTarget")
            return condition if condition.get("reason") == "HCSDeviceFailed" else {}

        condition = wait("the pod's DisruptionTarget HCSDeviceFailed", disrupted, 15, 0.02)
        times["-> pod evicted (DisruptionTarget HCSDeviceFailed)"] = time.monotonic() - fault
        # within seconds: the controller's 1 s debounce (--min-bad-seconds), then a round; the
        # bound is loose (a shared machine), the figure is what report() prints
        evicted_after = times["-> pod evicted (DisruptionTarget HCSDeviceFailed)"]
        print(f"fault -> DisruptionTarget HCSDeviceFailed: {evicted_after:.2f} s")
        assert evicted_after < 10, f"{evicted_after:.2f} s"
        assert condition["status"] == "True", condition
        assert gpu.uuid in condition["message"] and GPU in condition["message"], condition
        tainted = wait("the taint on the failed node", lambda: taint(kube, GPU), 10)
        times["-> node tainted"] = time.monotonic() - fault
        assert tainted["effect"] == "NoSchedule", tainted

        # The evicted pod has ended: its newest complete step is the one to resume from. A
        # newer step that never completed (a save cut short) must not be chosen.
        def ended() -> bool:  # Failed, or already deleted (a short grace period)
            pod = pods.get(kube, name)
            return pod is None or pod.get("status", {}).get("phase") == "Failed"

        wait("the evicted pod to end (Failed, or gone)", ended, 30)
        times["-> evicted pod ended"] = time.monotonic() - fault
        with Client(hcsd.socket) as client:  # hcsd freed its grant on the failed device
            wait("the evicted pod's allocation released", lambda: not client.allocations(), 10)
        newest = complete_steps(checkpoints)[-1]
        torn = checkpoints / f"step-{newest + 100}"
        torn.mkdir()
        (torn / "step").write_text(f"{newest + 100}\n")

        second = jobs.wait_running_pod(kube, JOB, {name}, timeout=60)
        times["-> replacement running"] = time.monotonic() - fault
        replacement = str(second["metadata"]["name"])
        assert second["spec"]["nodeName"] == NPU, "the failed node is out"
        inside = cluster.kubectl(
            "exec", replacement, "--", "sh", "-c",
            'echo "$HCS_RESUME_STATUS $HCS_RESUME_FROM"; cat "$HCS_RESUME_FROM/step"',
        ).split()  # fmt: skip
        assert inside == ["found", f"/ckpt/step-{newest}", str(newest)], inside
        wait(f"step-{newest + 1} saved after resuming",
             lambda: f"saved step-{newest + 1}" in logs(cluster, replacement), 15, 0.2)  # fmt: skip
        assert f"resume: status=found from=/ckpt/step-{newest}" in logs(cluster, replacement)
        assert jobs.get(kube, JOB)["status"].get("failed", 0) == 0, "Ignored: no backoff spent"
        # Every action is an Event (on the pod, on the ComputeNode) and a metric.
        wait_events(kube, "Pod", name, {"HCSDeviceFailed", "Evicted"})
        wait_events(kube, "ComputeNode", GPU, {"PodEvicted", "NodeTainted"})
        evictions = "hcs_controller_evictions_total"
        once = {"result": "evicted", "reason": "HCSDeviceFailed"}
        assert controller_metric(cluster, evictions, **once) == 1  # one pod, evicted once
        assert controller_metric(cluster, "hcs_controller_taints_total", action="taint") == 1

        # hcsd's quiet period passes: the device is healthy, and after the controller's own
        # quiet period the node is untainted.
        healthy, _ = watch.wait(pb.HEALTH_STATE_HEALTHY, unhealthy, healing.QUIET_PERIOD + 10)
        times["-> device healthy again"] = healthy - fault
        wait("the taint to go", lambda: taint(kube, GPU) is None, 30, 0.1)
        times["-> node untainted"] = time.monotonic() - fault

        cluster.kubectl("exec", replacement, "--", "touch", "/tmp/finish")
        done = jobs.wait_condition(kube, JOB, "Complete")
        assert done["status"].get("succeeded") == 1 and not done["status"].get("failed")
    finally:
        watch.close()
        jobs.delete(kube, JOB)
    report("self-healing (device failed)", times)
    print(f"self-healing: resumed from step-{newest} (newest complete); step-{newest + 100} "
          "(incomplete) not chosen")  # fmt: skip


def everything_healthy(cluster: KubeletCluster) -> None:
    """Both devices healthy and neither node tainted (the other test may have left the A100
    in its quiet period): the scores below compare healthy devices with a slow one."""
    kube = cluster.kube

    def healthy() -> bool:
        return all(
            device_status(kube, name, node.vendor.uuid).get("health") == "healthy"
            and taint(kube, name) is None
            for name, node in cluster.nodes.items()
        )

    wait("both devices healthy, no node tainted", healthy, healing.QUIET_PERIOD + 20, 0.2)


def probe(name: str) -> pods.PodSpec:
    """A pod any device may take: 8 GiB, no vendor or model named."""
    return pods.PodSpec(name, vram="8Gi")


def test_a_slow_device_is_scored_down_then_isolated(
    healing_kubelet_cluster: KubeletCluster,
) -> None:
    cluster = healing_kubelet_cluster
    kube = cluster.kube
    npu = cluster.nodes[NPU].vendor
    hcsd = cluster.nodes[NPU].hcsd
    assert hcsd is not None
    work = cluster.work
    victim, newcomer = "heal-slow", "heal-probe"
    times: dict[str, float] = {}
    watch = healing.HealthWatch(hcsd.socket, npu.uuid)
    try:
        everything_healthy(cluster)
        pods.create(kube, pods.PodSpec(victim, vendor=npu.vendor))
        pod = pods.wait_phase(kube, victim, {"Running"}, 30)
        assert pod["spec"]["nodeName"] == NPU
        manifest = pods.manifest(probe(newcomer))
        wait("the victim's allocation in the ComputeNode",
             lambda: device_status(kube, NPU, npu.uuid).get("vramAllocatedBytes"), 10)  # fmt: skip
        before = healing.extender_scores(cluster, manifest, [GPU, NPU])
        assert before[NPU] > before[GPU], before  # the better fit while it is healthy

        start = time.monotonic()
        healing.set_link_width(work, NPU, npu, 8)
        degraded, attributes = watch.wait(pb.HEALTH_STATE_DEGRADED, start, 15)
        times["link x8 -> device degraded"] = degraded - start
        assert degraded - start >= healing.SUBHEALTH_HOLD, "held for the hold time first"
        assert attributes.get("subhealth") == "pcie-link-width", attributes
        status = wait("the ComputeNode to say degraded",
                      lambda: device_status(kube, NPU, npu.uuid).get("health") == "degraded"
                      and device_status(kube, NPU, npu.uuid), 10)  # fmt: skip
        assert status.get("subhealth") == ["pcie-link-width"], status

        after = healing.extender_scores(cluster, manifest, [GPU, NPU])
        assert after[NPU] < after[GPU], after
        pods.create(kube, probe(newcomer))
        placed = pods.wait_phase(kube, newcomer, {"Running"}, 30)
        assert placed["spec"]["nodeName"] == GPU, "the slow device's node scored down"
        pods.delete(kube, newcomer, grace=0)
        # The shipped policy only scores it down: its pod keeps running. The controller must be
        # leading and acting for that to mean anything (a dead one keeps every pod running).
        wait("hcs-controller leading", lambda: controller_metric(cluster, "hcs_controller_leader")
             == 1, 15)  # fmt: skip
        time.sleep(3 * healing.MIN_BAD)
        assert controller_metric(cluster, "hcs_controller_leader") == 1
        kept = pods.get(kube, victim) or {}
        assert not kept["metadata"].get("deletionTimestamp"), kept["metadata"]
        assert not pods.condition(kept, "DisruptionTarget"), kept["status"]

        mark = time.monotonic()
        cluster.start_controller(healing.controller_flags(isolate_degraded=True))

        def disrupted() -> dict[str, Any]:
            condition = pods.condition(pods.get(kube, victim) or {}, "DisruptionTarget")
            return condition if condition.get("reason") == "HCSDeviceDegraded" else {}

        condition = wait("the victim's DisruptionTarget HCSDeviceDegraded", disrupted, 20, 0.02)
        times["--isolate-degraded started -> pod evicted"] = time.monotonic() - mark
        assert npu.uuid in condition["message"], condition
        wait("the taint on the slow device's node", lambda: taint(kube, NPU), 10)
        wait_events(kube, "Pod", victim, {"HCSDeviceDegraded", "Evicted"})

        mark = time.monotonic()
        healing.set_link_width(work, NPU, npu, 16)
        healthy, _ = watch.wait(pb.HEALTH_STATE_HEALTHY, mark, 15)
        times["link x16 -> device healthy"] = healthy - mark
        wait("the taint to go", lambda: taint(kube, NPU) is None, 20, 0.1)
        times["link x16 -> node untainted"] = time.monotonic() - mark
    finally:
        watch.close()
        healing.set_link_width(work, NPU, npu, 16)
        for name in (newcomer, victim):
            pods.delete(kube, name, grace=0)
        cluster.start_controller(healing.controller_flags())
    report("self-healing (slow device)", times)
    print(f"self-healing: extender scores for an 8 GiB pod: healthy {before}, degraded {after}")
