"""The control plane with kube-controller-manager on demand (`ControlPlane.controller_manager`):
its Job controller makes a Job's pod and its garbage collector removes the pod with the Job.
No kubelet runs here, so the pod stays Pending; tests/kubelet/test_jobs.py runs Jobs to the
end on real kubelets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster.conftest import _requirements
from tests.cluster.controlplane import ControlPlane
from tests.harness.kubecluster import jobs, pods
from tests.harness.peers.kubernetes import ensure_controller_manager
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def managed_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries, etcd = _requirements()
    manager = ensure_controller_manager()
    if isinstance(manager, str):
        pytest.skip(f"SKIP kube-controller-manager: {manager}")
    work = tmp_path_factory.mktemp("managed-plane")
    plane = ControlPlane(binaries, etcd, work, controller_manager=manager)
    try:
        yield plane.start()
    finally:
        plane.stop()


def test_a_jobs_pod_is_made_and_collected_with_the_job(managed_plane: ControlPlane) -> None:
    kube = managed_plane.kube()
    name = "managed-job"
    started = time.monotonic()
    jobs.create(kube, jobs.manifest(name, pods.PodSpec(name, vendor="nvidia")))
    try:
        wait_for(lambda: len(jobs.job_pods(kube, name)) == 1, "the Job's pod", timeout=30)
        made = time.monotonic() - started
        (pod,) = jobs.job_pods(kube, name)
        assert pod["metadata"]["ownerReferences"][0]["name"] == name
        assert pod["metadata"]["annotations"] == {"hcs.io/vendors": "nvidia"}
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"ai.compute/vram": "16Gi"}
    finally:
        mark = time.monotonic()
        jobs.delete(kube, name, timeout=30)  # the garbage collector removes the pod
        kube.close()
    print(f"job created -> pod made {made:.1f} s; job deleted -> pod gone "
          f"{time.monotonic() - mark:.1f} s")  # fmt: skip
