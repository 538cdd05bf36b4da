"""The admission webhook as the chart registers it, called by the real API server.

`helm install` makes the webhook's certificate, Service and MutatingWebhookConfiguration; the
webhook runs here as a process with the Secret's files (no kubelet runs its pod), and the
Service's endpoints name it at this host's address: the API server (with aggregator routing,
as there is no kube-proxy) calls it through the Service, checking its certificate against the
configuration's caBundle. Then: a pod asking for ai.compute/vram gets
`schedulerName: hcs-scheduler`; plain pods, opted-out pods and namespaces, and HCS's own
namespace are untouched; with the webhook down, failurePolicy Fail refuses only the pods that
ask for ai.compute/* (matchConditions keep the call off every other pod).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.kube import Kube, KubeError
from tests.cluster.helmchart import NAMESPACE, Helm, helm, start_webhook

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def webhook(
    helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    helm.install()
    directory = tmp_path_factory.mktemp("webhook")
    process = start_webhook(helm, directory)
    try:
        yield process
    finally:
        helm.plane.stop_process("webhook")


def create_pod(
    kube: Kube,
    name: str,
    *,
    namespace: str = "default",
    limits: dict[str, str] | None = None,
    init: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": {"limits": limits or {}}}
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}]}
    spec["initContainers" if init else "containers"] = [container]
    if init:
        spec["containers"] = [{"name": "app", "image": "busybox"}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
           "spec": spec}  # fmt: skip
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)


VRAM = {"ai.compute/vram": "16Gi"}


def test_pods_asking_for_ai_compute_go_to_hcs_scheduler(
    helm: Helm, webhook: subprocess.Popen[bytes]
) -> None:
    kube = helm.plane.kube()
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "opted-out", "labels": {"hcs.io/webhook": "disabled"}}})  # fmt: skip
    cases = {
        "vram": (create_pod(kube, "vram", limits=VRAM), "hcs-scheduler"),
        "init": (create_pod(kube, "init", limits=VRAM, init=True), "hcs-scheduler"),
        "plain": (create_pod(kube, "plain", limits={"cpu": "1"}), "default-scheduler"),
        "labelled": (
            create_pod(kube, "labelled", limits=VRAM, labels={"hcs.io/webhook": "disabled"}),
            "default-scheduler",
        ),
        "namespace": (
            create_pod(kube, "ns", namespace="opted-out", limits=VRAM),
            "default-scheduler",
        ),
        "own": (create_pod(kube, "own", namespace=NAMESPACE, limits=VRAM), "default-scheduler"),
    }
    got = {name: pod["spec"]["schedulerName"] for name, (pod, _) in cases.items()}
    assert got == {name: wanted for name, (_, wanted) in cases.items()}
    log = (Path(str(webhook.args[-1])).parent / "webhook.log").read_text()
    assert log.count("spec.schedulerName set to hcs-scheduler") == 2  # called for those two

    # The webhook down: failurePolicy Fail refuses only pods asking for ai.compute/*.
    helm.plane.stop_process("webhook")
    with pytest.raises(KubeError) as refused:
        create_pod(kube, "vram-down", limits=VRAM)
    assert "scheduler-name.hcs.io" in str(refused.value)
    plain = create_pod(kube, "plain-down", limits={"cpu": "1"})
    assert plain["spec"]["schedulerName"] == "default-scheduler"
    kube.close()
    helm.uninstall()
