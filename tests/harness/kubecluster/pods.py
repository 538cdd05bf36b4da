"""Pods on the kubelet cluster: the demo pod's spec, and creating, waiting for, reading and
deleting pods through the API server.

The demo pod: the busybox image (imported into each node's containerd, never
pulled), the host's network, `limits: {ai.compute/vram: 16Gi}`, pinned to a vendor with the
`hcs.io/vendors` annotation the extender reads. The image has no libc, so the host's is
mounted read-only (hostPath volumes), with the test programs (tests/fakes/build: alloc_app),
as an application image would carry its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsd.cluster.kube import Kube, KubeError
from tests.fakes import BUILD as FAKES_BUILD
from tests.runtime.image import BUSYBOX_IMAGE

NAMESPACE = "default"
TOOLS = "/opt/hcs-test"
LIBC_DIR = Path("/lib/x86_64-linux-gnu").resolve()
LOADER_DIR = Path("/lib64").resolve()
# PID 1 ignores TERM unless it traps it: the pod would take its whole grace period to stop.
SLEEP = "trap 'exit 0' TERM; sleep 3600 & wait"


@dataclass(frozen=True)
class HostVolume:
    """A host directory the container mounts read-write (a checkpoint directory)."""

    name: str
    path: Path  # on the host: both nodes see the host's file systems
    mount: str  # in the container


@dataclass(frozen=True)
class PodSpec:
    name: str
    vendor: str | None = None  # hcs.io/vendors
    vram: str = "16Gi"
    command: str = SLEEP
    run_as_user: int | None = None
    annotations: tuple[tuple[str, str], ...] = ()  # besides hcs.io/vendors
    volumes: tuple[HostVolume, ...] = ()


def manifest(spec: PodSpec) -> dict[str, Any]:
    volumes = {"libc": LIBC_DIR, "loader": LOADER_DIR, "tools": FAKES_BUILD}
    inside = {"libc": "/lib/x86_64-linux-gnu", "loader": "/lib64", "tools": TOOLS}
    container: dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", spec.command],
        "resources": {"limits": {"ai.compute/vram": spec.vram}},
        "volumeMounts": [{"name": n, "mountPath": inside[n], "readOnly": True} for n in volumes]
        + [{"name": v.name, "mountPath": v.mount} for v in spec.volumes],
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spec.name,
            "namespace": NAMESPACE,
            "annotations": ({"hcs.io/vendors": spec.vendor} if spec.vendor else {})
            | dict(spec.annotations),
        },
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            "volumes": [
                {"name": n, "hostPath": {"path": str(p), "type": "Directory"}}
                for n, p in [*volumes.items(), *((v.name, v.path) for v in spec.volumes)]
            ],
        },
    }
    if spec.run_as_user is not None:
        pod["spec"]["securityContext"] = {
            "runAsUser": spec.run_as_user,
            "runAsGroup": spec.run_as_user,
        }
    return pod


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"


def create(kube: Kube, spec: PodSpec) -> dict[str, Any]:
    return kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", manifest(spec))


def get(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        return kube.get(pod_path(name))
    except KubeError as e:
        if e.not_found:
            return None
        raise


def wait_phase(kube: Kube, name: str, phases: set[str], timeout: float = 60) -> dict[str, Any]:
    """The pod once its phase is one of `phases` (AssertionError with its status if not)."""
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        pod = get(kube, name)
        if pod is not None and pod.get("status", {}).get("phase") in phases:
            return pod
        time.sleep(0.1)
    raise AssertionError(f"pod {name} not {sorted(phases)} in {timeout:g} s: {pod}")


def container_id(pod: dict[str, Any]) -> str:
    """The main container's runtime id (without `containerd://`)."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status["name"] == "main" and status.get("containerID"):
            return str(status["containerID"]).split("://", 1)[-1]
    raise AssertionError(f"pod {pod['metadata']['name']} has no container id yet")


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def delete(kube: Kube, name: str, grace: int | None = None) -> None:
    body = {} if grace is None else {"gracePeriodSeconds": grace}
    try:
        kube.request("DELETE", pod_path(name), body=body)
    except KubeError as e:
        if not e.not_found:
            raise
