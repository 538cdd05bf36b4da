"""Kubernetes Jobs on the kubelet cluster: kube-controller-manager's Job controller makes the
pods, kube-scheduler places them through HCS's extender, the nodes' kubelets run them.

A Job here is the demo pod (pods.manifest: busybox, the host's network, limits
`ai.compute/vram`) as its template, `completions: 1`, a `backoffLimit`, and a
`podFailurePolicy` whose first rule acts on a pod with the `DisruptionTarget` condition: what
the API server sets on a pod evicted through the Eviction API, as HCS's isolation evicts the
pods of a failed device. Its default action is `Ignore`: a device that fails under a job is
not the job's failure, so the replacement does not spend `backoffLimit` (`Count` would,
`FailJob` would end the job). Any other failure counts against it.

Ignored or not, a failed pod delays its replacement: the Job controller of v1.36 keeps its
pod-creation back-off (10 s after the first failure since the last success, doubling, at
most 6 min; `DefaultJobPodFailureBackOff`, no flag) for every failed pod, the ignored ones
included. An evicted pod's replacement starts about 10 s after the pod ended: a floor under
any "fault -> replacement running" figure measured with a Job.
"""

from __future__ import annotations

import time
from collections.abc import Set
from typing import Any

from hcsd.cluster.kube import Kube, KubeError
from tests.harness.kubecluster import pods

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# The workload's PID 1 exits non-zero when told to stop: a deleted or evicted pod ends
# Failed, never Succeeded (which would complete the Job instead of replacing the pod).
STOPPED = "trap 'exit 143' TERM"


def jobs_path(name: str = "") -> str:
    return f"/apis/batch/v1/namespaces/{pods.NAMESPACE}/jobs" + (f"/{name}" if name else "")


def manifest(
    name: str,
    pod: pods.PodSpec,
    *,
    backoff_limit: int = 2,
    on_disruption: str = "Ignore",
) -> dict[str, Any]:
    """A Job of one completion running `pod` (its name is the Job controller's to choose)."""
    template = pods.manifest(pod)
    template["metadata"] = {"annotations": template["metadata"]["annotations"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": pods.NAMESPACE},
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": backoff_limit,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": on_disruption,
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "template": template,
        },
    }


def create(kube: Kube, job: dict[str, Any]) -> dict[str, Any]:
    return kube.create(jobs_path(), job)


def get(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get(jobs_path(name))


def condition(job: dict[str, Any], kind: str) -> bool:
    """Whether the Job has condition `kind` (Complete, Failed, ...) with status True."""
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in job.get("status", {}).get("conditions") or []
    )


def wait_condition(kube: Kube, name: str, kind: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job = get(kube, name)
    while time.monotonic() < deadline:
        job = get(kube, name)
        if condition(job, kind):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {name} not {kind} in {timeout:g} s: {job.get('status')}")


def job_pods(kube: Kube, name: str) -> list[dict[str, Any]]:
    """The Job's pods, oldest first."""
    found = kube.get(
        f"/api/v1/namespaces/{pods.NAMESPACE}/pods",
        query=[("labelSelector", f"{JOB_NAME_LABEL}={name}")],
    ).get("items", [])
    return sorted(found, key=lambda p: str(p["metadata"]["creationTimestamp"]))


def wait_running_pod(
    kube: Kube, name: str, not_these: Set[str] = frozenset(), timeout: float = 60
) -> dict[str, Any]:
    """A pod of the Job, none of `not_these`, once it runs (AssertionError with the pods)."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = job_pods(kube, name)
        for pod in found:
            if pod["metadata"]["name"] in not_these:
                continue
            if pod.get("status", {}).get("phase") == "Running":
                return pod
        time.sleep(0.1)
    shown = [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in found]
    raise AssertionError(f"no new running pod of job {name} in {timeout:g} s: {shown}")


def evict(kube: Kube, pod: str) -> None:
    """Through the Eviction API (PodDisruptionBudgets respected), as HCS's isolation evicts:
    the API server gives the pod the `DisruptionTarget` condition, then deletes it."""
    kube.create(
        f"{pods.pod_path(pod)}/eviction",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": pods.NAMESPACE},
        },
    )


def delete(kube: Kube, name: str, timeout: float = 60) -> None:
    """The Job and, through the garbage collector, its pods: back once none is left."""
    try:
        kube.request("DELETE", jobs_path(name), body={"propagationPolicy": "Background"})
    except KubeError as e:
        if not e.not_found:
            raise
    deadline = time.monotonic() + timeout
    while job_pods(kube, name):
        if time.monotonic() > deadline:
            raise AssertionError(f"job {name}'s pods still there after {timeout:g} s")
        time.sleep(0.2)
