"""A Kubernetes Job on the real kubelets: kube-controller-manager's Job controller makes its
pod, kube-scheduler places it through HCS's extender on the simulated NVIDIA node, hcsd
gives its container the quota, and a pod the Job loses is replaced and runs.

Two losses, told apart by the Job's podFailurePolicy (tests/harness/kubecluster/jobs.py): an
eviction through the Eviction API (what HCS's isolation does to the pods of a failed device)
leaves the `DisruptionTarget` condition, which the rule `Ignore`s: the replacement costs
nothing of `backoffLimit`; a plain deletion is a failure the Job counts. Either way the Job
controller waits its pod-creation back-off before the replacement (10 s after the first
failed pod, 20 s after the second: it counts ignored pods there too), as the times printed
show.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.harness.kubecluster import jobs, pods
from tests.harness.kubecluster.cluster import KubeletCluster

pytestmark = pytest.mark.slow

GiB = 2**30
JOB = "hcs-job"
# Shows what hcsd gave the container, then works until told to finish (a file the test
# makes with `kubectl exec`); stopped, it fails (jobs.STOPPED).
WORKLOAD = (
    f'{jobs.STOPPED}; echo HCS_CONFIG=$HCS_CONFIG; cat "$HCS_CONFIG"; echo working; '
    "while [ ! -e /tmp/finish ]; do sleep 0.2; done; echo finished"
)


def wait_logs(cluster: KubeletCluster, pod: str, line: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = cluster.kubectl("logs", pod, check=False)
        if line in out.splitlines():
            return out
        time.sleep(0.2)
    raise AssertionError(f"{pod} did not log {line!r} in {timeout:g} s:\n{out}")


def check_quota(cluster: KubeletCluster, pod: dict[str, Any]) -> str:
    """The pod runs on the NVIDIA node and its container got hcsd's quota file."""
    name = str(pod["metadata"]["name"])
    node = cluster.nodes["kube-gpu"]
    assert pod["spec"]["nodeName"] == node.name
    out = wait_logs(cluster, name, "working")
    assert "HCS_CONFIG=/run/hcs/quota.conf" in out.splitlines(), out
    assert f"device.0.vendor={node.vendor.vendor}" in out, out
    assert f"device.0.vram_limit={16 * GiB}" in out, out
    return name


def test_a_job_completes_and_its_lost_pods_are_replaced(kubelet_cluster: KubeletCluster) -> None:
    cluster = kubelet_cluster
    kube = cluster.kube
    times: dict[str, float] = {}
    started = time.monotonic()
    jobs.create(kube, jobs.manifest(JOB, pods.PodSpec(JOB, vendor="nvidia", command=WORKLOAD)))
    try:
        first = check_quota(cluster, jobs.wait_running_pod(kube, JOB))
        times["job created -> pod running"] = time.monotonic() - started

        # Evicted (DisruptionTarget): ignored by the policy, replaced after the back-off.
        mark = time.monotonic()
        jobs.evict(kube, first)
        second = check_quota(cluster, jobs.wait_running_pod(kube, JOB, {first}))
        times["evicted -> replacement running"] = time.monotonic() - mark
        status = jobs.get(kube, JOB)["status"]
        assert status.get("failed", 0) == 0, status  # Ignore: the backoff budget is whole

        # Deleted: a failure the Job counts; the back-off has doubled.
        mark = time.monotonic()
        pods.delete(kube, second)
        third = check_quota(cluster, jobs.wait_running_pod(kube, JOB, {first, second}))
        times["deleted -> replacement running"] = time.monotonic() - mark
        status = jobs.get(kube, JOB)["status"]
        assert status.get("failed", 0) == 1, status

        mark = time.monotonic()
        cluster.kubectl("exec", third, "--", "touch", "/tmp/finish")
        done = jobs.wait_condition(kube, JOB, "Complete")
        times["finished -> Job Complete"] = time.monotonic() - mark
        assert done["status"].get("succeeded") == 1, done["status"]
        assert not jobs.condition(done, "Failed"), done["status"]
        assert "finished" in cluster.kubectl("logs", third).splitlines()
    finally:
        jobs.delete(kube, JOB)
    times["total"] = time.monotonic() - started
    print("job times: " + ", ".join(f"{what} {seconds:.1f} s" for what, seconds in times.items()))
