"""DRA mode's runtime profiles on a real kubelet and containerd 2.3: a claim naming a
RuntimeProfile (the annotation the webhook's template gives its claims) is prepared by the
syncer's kubelet plugin with the profile's entry for the allocated device, and hcsd's NRI
plugin gives the claim's container the profile's env and entrypoint; a container whose image
is not the entry's does not start.

The gate and the choice of vendor are tests/cluster/test_dra_profiles.py's; here the pods are
written with the image already set, and the slice and class are test_dra.py's (`offered`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hcsd.cluster.kube import KubeError
from tests.harness.kubecluster import pods
from tests.harness.kubecluster.cluster import KubeletCluster
from tests.harness.kubecluster.node import KubeletNode
from tests.harness.waiting import wait_for
from tests.kubelet.test_dra import CLAIMS, _delete, claim, claim_pod, offered
from tests.runtime.image import BUSYBOX_IMAGE

pytestmark = pytest.mark.slow

__all__ = ["offered"]  # the fixture, used here

PROFILES = "/apis/hcs.io/v1alpha1/runtimeprofiles"
ENTRYPOINT = "echo profile-entrypoint-ran; sleep 3600"


def profile(name: str, vendor: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "hcs.io/v1alpha1", "kind": "RuntimeProfile", "metadata": {"name": name},
        "spec": {"runtimes": [{
            "vendor": vendor, "image": image,
            "env": [{"name": "PROFILE_TEST_VAR", "value": "applied"}],
            "command": ["sh", "-c", ENTRYPOINT],
        }]},
    }  # fmt: skip


@pytest.fixture(scope="module")
def profiles(kubelet_cluster: KubeletCluster, offered: KubeletNode) -> Iterator[KubeletNode]:
    kube, vendor = kubelet_cluster.kube, offered.vendor.vendor
    kube.create(PROFILES, profile("hcs-test-dra-busybox", vendor, BUSYBOX_IMAGE))
    kube.create(PROFILES, profile("hcs-test-dra-other", vendor, "registry.example.com/other:1"))
    yield offered
    for name in ("hcs-test-dra-busybox", "hcs-test-dra-other"):
        _delete(kube, f"{PROFILES}/{name}")


def profile_pod(kube: Any, name: str, runtime_profile: str) -> None:
    made = claim(name, "8Gi", "10")
    made["metadata"]["annotations"] = {"hcs.io/runtime-profile": runtime_profile}
    kube.create(CLAIMS, made)
    pod = claim_pod(name, name, None)
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "echo placeholder; sleep 3600"]
    kube.create(f"/api/v1/namespaces/{pods.NAMESPACE}/pods", pod)


def finish(kube: Any, name: str) -> None:
    pods.delete(kube, name, grace=0)
    try:
        kube.request("DELETE", f"{CLAIMS}/{name}")
    except KubeError as e:
        if not e.not_found:
            raise


def test_the_claims_profile_sets_env_and_entrypoint(
    kubelet_cluster: KubeletCluster, profiles: KubeletNode
) -> None:
    cluster, kube, name = kubelet_cluster, kubelet_cluster.kube, "dra-profile"
    profile_pod(kube, name, "hcs-test-dra-busybox")
    try:
        pod = pods.wait_phase(kube, name, {"Running", "Failed", "Succeeded"}, timeout=120)
        assert pod["status"]["phase"] == "Running", pod["status"]
        # pid 1's own environment and command line: what the runtime started it with
        env = cluster.kubectl("exec", name, "--", "cat", "/proc/1/environ").split("\0")
        cmdline = cluster.kubectl("exec", name, "--", "cat", "/proc/1/cmdline")
        logs = cluster.kubectl("logs", name)
        print(f"{name}: pid 1 {cmdline.replace(chr(0), ' ')!r}, output {logs!r}")
        assert "PROFILE_TEST_VAR=applied" in env, env
        assert "profile-entrypoint-ran" in logs and "placeholder" not in logs
        assert "HCS_CONFIG=/run/hcs/quota.conf" in env  # the claim's own, kept
    finally:
        finish(kube, name)


def test_a_container_whose_image_is_not_the_profiles_does_not_start(
    kubelet_cluster: KubeletCluster, profiles: KubeletNode
) -> None:
    kube, name = kubelet_cluster.kube, "dra-profile-wrong-image"
    profile_pod(kube, name, "hcs-test-dra-other")
    found: dict[str, str] = {}

    def refused() -> bool:
        pod = kube.get(pods.pod_path(name))
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerError":
                found["message"] = str(waiting.get("message"))
                return True
        return False

    try:
        wait_for(refused, "the container refused at creation", timeout=120, interval=1)
        print(f"{name}: {found['message']}")
        assert "is not runtime profile 'hcs-test-dra-other'" in found["message"]
    finally:
        finish(kube, name)
