"""Runtime profiles in DRA mode on the real kube-apiserver, kube-controller-manager and
kube-scheduler 1.36: a pod naming a RuntimeProfile is admitted gated (the webhook's patch,
webhook_dra.dra_patch), the profile gate (profile_gate_controller.ProfileGate, run with the
extender's service-account token under the shipped RBAC and ValidatingAdmissionPolicy) sets
its image for the vendor with room, narrows its node affinity and removes the gate, and
kube-scheduler allocates its claim on that vendor. With that vendor full, the other.

The nodes and slices are test_dra_allocation's: `gpu-a` with two A100-SXM4-80GB, `npu-b`
with two Ascend 910B3 (fake Nodes, hand-written ResourceSlices: no kubelet runs).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hcsd.cluster.claim_templates import Templates
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.profile_gate import gated
from hcsd.cluster.profile_gate_controller import ProfileGate
from hcsd.cluster.runtime_profiles import runtime_profile
from hcsd.cluster.webhook_dra import dra_patch
from hcsd.profiles.database import default_database
from tests.cluster.controlplane import (
    REPO,
    ControlPlane,
    manifests,
    request_token,
    token_kubeconfig,
)
from tests.cluster.test_dra_allocation import (
    allocation,
    start_dra_plane,
)
from tests.harness.waiting import wait_for
from tests.unit.test_webhook_dra import apply

pytestmark = pytest.mark.slow

PROFILE = {
    "apiVersion": "hcs.io/v1alpha1", "kind": "RuntimeProfile",
    "metadata": {"name": "pytorch-2.5"},
    "spec": {"codeMount": "/workspace", "runtimes": [
        {"vendor": "nvidia", "image": "registry.example.com/ngc/pytorch:24.10-py3",
         "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
        {"vendor": "ascend", "image": "registry.example.com/ascend/pytorch:2.1.0"},
    ]},
}  # fmt: skip
PODS = "/api/v1/namespaces/default/pods"


def _extender_rbac() -> list[dict[str, Any]]:
    """The extender's account, its role, the requeue policy and DRA mode's claim role."""
    shipped = manifests("namespace.yaml", "rbac-extender.yaml", "admission-requeue.yaml")
    dra = yaml.safe_load_all((REPO / "packaging" / "kubernetes-dra" / "dra.yaml").read_text())
    claims = [
        d for d in dra
        if d and d["metadata"]["name"] == "hcs-scheduler-extender-resourceclaims"
    ]  # fmt: skip
    for doc in claims:
        for subject in doc.get("subjects") or ():
            subject["namespace"] = "hcs-system"
    return shipped + claims


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    objects = manifests("crds/runtimeprofiles.yaml") + _extender_rbac() + [PROFILE]
    plane = start_dra_plane(tmp_path_factory.mktemp("dra-profiles"), objects)
    try:
        yield plane
    finally:
        plane.stop()


def extender_kube(plane: ControlPlane) -> Kube:
    admin = plane.kube()
    token = request_token(admin, "hcs-scheduler-extender")
    admin.close()
    path = token_kubeconfig(plane.work / "extender-token.kubeconfig", plane.server,
                            plane.work / "certs", token)  # fmt: skip
    return Kube.connect(str(path))


def admitted(kube: Kube, name: str, limits: dict[str, str], **notes: str) -> dict[str, Any]:
    """A pod as the DRA webhook patches it (with the RuntimeProfile read as it reads it)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": dict(notes)},
        "spec": {"containers": [
            {"name": "main", "image": "registry.example.com/team/code:7",
             "resources": {"limits": dict(limits)}},
            {"name": "sidecar", "image": "registry.example.com/proxy:1"},
        ]},
    }  # fmt: skip
    profile = runtime_profile(kube.get("/apis/hcs.io/v1alpha1/runtimeprofiles/pytorch-2.5"))
    outcome = dra_patch(
        pod, "default", Templates(kube).ensure, profiles=lambda _: profile, db=default_database()
    )
    return kube.create(PODS, apply(copy.deepcopy(pod), outcome.patch))


def node_fields(pod: dict[str, Any]) -> list[Any]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return [t["matchFields"] for t in terms]


def test_a_profile_pod_waits_gated_then_runs_the_image_of_the_vendor_with_room(
    plane: ControlPlane,
) -> None:
    kube = plane.kube()
    gate = ProfileGate(extender_kube(plane), default_database())
    made = admitted(kube, "train", {"ai.compute/vram": "16Gi"},
                    **{"hcs.io/runtime-profile": "pytorch-2.5"})  # fmt: skip
    assert gated(made)

    def scheduling_gated() -> bool:
        pod = kube.get(f"{PODS}/train")
        conditions = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        return conditions.get("PodScheduled", {}).get("reason") == "SchedulingGated"

    wait_for(scheduling_gated, "kube-scheduler to see the pod gated", timeout=30, interval=0.3)
    assert not kube.get(f"{PODS}/train")["spec"].get("nodeName")

    assert gate.pass_once() == 1
    pod = kube.get(f"{PODS}/train")
    assert not gated(pod)
    main, sidecar = pod["spec"]["containers"]
    # the claim's first alternative, an Ascend device, has room: its image, its node
    assert main["image"] == "registry.example.com/ascend/pytorch:2.1.0"
    assert sidecar["image"] == "registry.example.com/proxy:1"
    assert node_fields(pod) == [[{"key": "metadata.name", "operator": "In", "values": ["npu-b"]}]]
    node, (result,) = allocation(kube, "train")
    assert node == "npu-b" and result["device"].startswith("ascend-")
    assert gate.pass_once() == 0  # nothing left gated

    # Fill both 910B3s (64Gi each; `train` holds 16Gi of one) with pods naming no profile...
    for name, vram in (("fill-0", "64Gi"), ("fill-1", "48Gi")):
        created = admitted(kube, name, {"ai.compute/vram": vram},
                           **{"hcs.io/vendors": "ascend"})  # fmt: skip
        assert not gated(created)
        assert allocation(kube, name)[0] == "npu-b"
    # ...and the next profile pod gets the NVIDIA image and an A100.
    admitted(kube, "train-2", {"ai.compute/vram": "16Gi"},
             **{"hcs.io/runtime-profile": "pytorch-2.5"})  # fmt: skip
    assert gate.pass_once() == 1
    pod = kube.get(f"{PODS}/train-2")
    assert pod["spec"]["containers"][0]["image"] == "registry.example.com/ngc/pytorch:24.10-py3"
    assert node_fields(pod) == [[{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]]
    node, (result,) = allocation(kube, "train-2")
    assert node == "gpu-a" and result["device"].startswith("nvidia-")
    kube.close()


def test_the_extenders_token_may_not_ungate_a_pod_naming_no_profile(plane: ControlPlane) -> None:
    """The policy lets the extender's account remove the gate only of a pod naming a
    RuntimeProfile: a tenant's own gate of that name on another pod stays the tenant's."""
    kube = plane.kube()
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "other", "namespace": "default"},
        "spec": {"schedulingGates": [{"name": "hcs.io/runtime-profile"}],
                 "containers": [{"name": "main", "image": "busybox"}]},
    }  # fmt: skip
    kube.create(PODS, pod)
    extender = extender_kube(plane)
    with pytest.raises(KubeError) as refused:
        extender.request(
            "PATCH", f"{PODS}/other",
            body=[{"op": "remove", "path": "/spec/schedulingGates/0"}],
            content_type="application/json-patch+json",
        )  # fmt: skip
    assert refused.value.status in (403, 422)
    assert "hcs-scheduler-extender may change a pod's spec only" in str(refused.value)
    kube.close()


def test_the_extenders_gate_follows_gated_pods_with_a_watch(plane: ControlPlane) -> None:
    """As the extender runs it (`--profile-gate`): a watch of the unbound pods keeps the
    gated ones, and the leader's passes release a profile pod admitted after it started.
    A pod the tenant gated without naming a profile (`other`, above) stays gated."""
    kube = plane.kube()
    gate = ProfileGate(extender_kube(plane), default_database(), watch=True)
    stopping = threading.Event()
    runner = threading.Thread(target=gate.run, args=(stopping, 0.2, lambda: True), daemon=True)
    runner.start()
    try:
        assert gate.pods is not None
        wait_for(gate.pods.synced.is_set, "the gate's watch to list", timeout=30)
        admitted(kube, "watched", {"ai.compute/vram": "8Gi"},
                 **{"hcs.io/runtime-profile": "pytorch-2.5"})  # fmt: skip
        wait_for(lambda: not gated(kube.get(f"{PODS}/watched")), "the pod released", timeout=30)
        image = kube.get(f"{PODS}/watched")["spec"]["containers"][0]["image"]
        assert image in {e["image"] for e in PROFILE["spec"]["runtimes"]}
        assert allocation(kube, "watched")[0] in ("gpu-a", "npu-b")
        # released, bound: the watch forgets it; the tenant's own gate stays
        wait_for(lambda: "default/watched" not in gate.pods.items, "the watch to drop it",
                 timeout=30)  # fmt: skip
        assert set(gate.pods.items) <= {"default/other"}
    finally:
        stopping.set()
        runner.join(10)
        kube.close()
