"""The webhook's claim templates allocated by the real kube-scheduler 1.36 (DynamicResources,
no extender), against hand-written DeviceClasses and ResourceSlices on fake Nodes.

Two nodes: `gpu-a` with two A100-SXM4-80GB on one NVLink domain, `npu-b` with two Ascend
910B3. The slices are what the DRA mode's publisher is to write (contract/dra.py names,
consumable `memory` and `compute` with allowMultipleAllocations), written here by hand so this
test depends on the translation alone. kube-controller-manager's resource-claim controller
makes each pod's claim from its template; the pods are patched exactly as the webhook patches
them (webhook_dra.dra_patch, templates made through claim_templates). Then:
- 16Gi on nvidia: one A100, 16Gi of its memory and no compute consumed, the device shared
  by a second such pod;
- 100 TFLOPS on a 910B3: 32% of one, as the extender's exchange rate reserves;
- the issue's list (A100, 910B3 or 2 MLU370) with the A100s' compute taken: the 910B3;
- 2 devices on one link domain (high-bandwidth): both A100s of gpu-a, distinct.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.claim_quota import QuotaGate
from hcsd.cluster.claim_templates import Templates
from hcsd.cluster.compute_quota import Amounts
from hcsd.cluster.kube import Kube
from hcsd.cluster.webhook_dra import Refused, dra_patch
from hcsd.contract.dra import CLASS_ANY, DRIVER, vendor_class
from hcsd.profiles.database import default_database
from tests.cluster.conftest import _requirements
from tests.cluster.controlplane import REPO, ControlPlane, register_node
from tests.harness.peers.kubernetes import ensure_controller_manager
from tests.harness.waiting import wait_for
from tests.unit.test_webhook_dra import apply

pytestmark = pytest.mark.slow

RESOURCE = "/apis/resource.k8s.io/v1"
GiB = 2**30


def device(vendor: str, index: int, model: str, vram_gib: int, link: str) -> dict[str, Any]:
    return {
        "name": f"{vendor}-{index}",
        "attributes": {
            "vendor": {"string": vendor},
            "model": {"string": model},
            "uuid": {"string": f"{vendor}-{index}-uuid-{link}"},
            "index": {"int": index},
            "linkDomain": {"string": link},
        },
        "capacity": {
            "memory": {
                "value": f"{vram_gib}Gi",
                "requestPolicy": {
                    "default": f"{vram_gib}Gi",
                    "validRange": {"min": "256Mi", "step": "256Mi"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "0", "step": "1"}},
            },
        },
        "allowMultipleAllocations": True,
    }


def slice_for(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip


def device_class(name: str, vendor: str = "") -> dict[str, Any]:
    test = f'device.driver == "{DRIVER}"'
    if vendor:
        test += f' && device.attributes["{DRIVER}"].vendor == "{vendor}"'
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": test}}]},
    }  # fmt: skip


def start_dra_plane(work: Path, objects: Sequence[dict[str, Any]] = ()) -> ControlPlane:
    """A started control plane with kube-controller-manager and kube-scheduler, `objects`
    applied, and the two fake nodes' slices and HCS's DeviceClasses; the caller stops it."""
    binaries, etcd = _requirements()
    manager = ensure_controller_manager()
    if isinstance(manager, str):
        pytest.skip(f"SKIP kube-controller-manager: {manager}")
    plane = ControlPlane(binaries, etcd, work, controller_manager=manager).start()
    try:
        if objects:
            plane.apply(list(objects))
        kube = plane.kube()
        for name in ("gpu-a", "npu-b"):
            register_node(kube, name)
        a100 = [device("nvidia", i, "A100-SXM4-80GB", 80, "nvl-a") for i in (0, 1)]
        npu = [device("ascend", i, "Ascend910B3", 64, "hccs-b") for i in (0, 1)]
        kube.create(f"{RESOURCE}/resourceslices", slice_for("gpu-a", a100))
        kube.create(f"{RESOURCE}/resourceslices", slice_for("npu-b", npu))
        for name, vendor in [
            (CLASS_ANY, ""),
            *((vendor_class(v), v) for v in ("nvidia", "ascend", "cambricon", "hygon")),
        ]:
            kube.create(f"{RESOURCE}/deviceclasses", device_class(name, vendor))  # fmt: skip
        kube.close()
        plane.start_scheduler(None)
    except BaseException:
        plane.stop()
        raise
    return plane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = start_dra_plane(tmp_path_factory.mktemp("dra-plane"))
    try:
        yield plane
    finally:
        plane.stop()


def admitted_pod(
    kube: Kube, name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """The pod as the webhook would patch it, created."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": dict(limits)}}]},
    }  # fmt: skip
    outcome = dra_patch(pod, "default", Templates(kube).ensure)
    return kube.create("/api/v1/namespaces/default/pods", apply(copy.deepcopy(pod), outcome.patch))


def allocation(kube: Kube, name: str) -> tuple[str, list[dict[str, Any]]]:
    """(node, device results) once the pod is bound and its claim allocated."""
    found: dict[str, Any] = {}

    def bound() -> bool:
        pod = kube.get(f"/api/v1/namespaces/default/pods/{name}")
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if not pod["spec"].get("nodeName") or not statuses:
            return False
        claim = kube.get(
            f"{RESOURCE}/namespaces/default/resourceclaims/{statuses[0]['resourceClaimName']}"
        )
        found["node"] = pod["spec"]["nodeName"]
        found["results"] = claim["status"]["allocation"]["devices"]["results"]
        return True

    wait_for(bound, f"pod {name} bound with its claim allocated", timeout=60, interval=0.3)
    return found["node"], found["results"]


def test_claims_from_the_templates_land_on_the_devices_the_shapes_ask_for(
    plane: ControlPlane,
) -> None:
    kube = plane.kube()
    node, (result,) = allocation(
        kube, admitted_pod(kube, "slice", {"ai.compute/vram": "16Gi"}, {"hcs.io/vendors": "nvidia"})
        ["metadata"]["name"],
    )  # fmt: skip
    assert node == "gpu-a" and result["driver"] == DRIVER and result["request"] == "r0"
    assert result["consumedCapacity"] == {"memory": "16Gi", "compute": "0"}
    # 100 TFLOPS of a 910B3 (313 each): 32% of one, as the extender reserves.
    node, (result,) = allocation(kube, admitted_pod(
        kube, "tflops", {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"},
        {"hcs.io/models": "Ascend910B3"})["metadata"]["name"])  # fmt: skip
    assert node == "npu-b" and result["device"].startswith("ascend-")
    assert result["consumedCapacity"] == {"memory": "16Gi", "compute": "32"}
    kube.close()


def test_two_devices_on_one_link_domain_and_the_next_alternative_when_the_first_is_full(
    plane: ControlPlane,
) -> None:
    kube = plane.kube()
    # 32Gi on each of two distinct devices of one NVLink domain: gpu-a's two A100s.
    node, results = allocation(kube, admitted_pod(
        kube, "pair", {"ai.compute/devices": "2", "ai.compute/vram": "32Gi"},
        {"hcs.io/vendors": "nvidia", "hcs.io/topology-preference": "high-bandwidth"},
    )["metadata"]["name"])  # fmt: skip
    assert node == "gpu-a"
    assert sorted(r["device"] for r in results) == ["nvidia-0", "nvidia-1"]
    assert all(r["consumedCapacity"]["memory"] == "32Gi" for r in results)
    # 290 TFLOPS twice: 93% of each A100 (312); none has the 33% the list asks of it
    # first, so its second alternative, a 910B3, is allocated.
    for name in ("hog-0", "hog-1"):
        node, (result,) = allocation(kube, admitted_pod(
            kube, name, {"ai.compute/vram": "1Gi", "ai.compute/tflops-fp16": "290"},
            {"hcs.io/models": "A100"})["metadata"]["name"])  # fmt: skip
        assert node == "gpu-a" and result["consumedCapacity"]["compute"] == "93"
    node, (result,) = allocation(kube, admitted_pod(
        kube, "listed", {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"},
        {"hcs.io/models": "A100,Ascend910B3,MLU370-X8"})["metadata"]["name"])  # fmt: skip
    assert node == "npu-b" and result["request"] == "r0/alt1"
    assert result["consumedCapacity"] == {"memory": "16Gi", "compute": "32"}
    kube.close()


def test_the_compute_quota_counts_the_claims_kube_scheduler_allocated(
    plane: ControlPlane,
) -> None:
    """vram 24Gi in namespace `quota`: a 16Gi pod admitted through the quota gate, its claim
    allocated by kube-scheduler; a gate that never saw it (another replica, or a restart)
    counts the claim's consumed 16Gi (once: not the pod's charge as well, and with the
    charge removed from the pod still) and refuses 16Gi more."""
    crds = REPO / "packaging" / "helm" / "hcs" / "crds"
    plane.apply([yaml.safe_load((crds / "computequotas.yaml").read_text())])
    kube = plane.kube()
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "quota"}})  # fmt: skip
    kube.create("/apis/hcs.io/v1alpha1/namespaces/quota/computequotas", {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": "quota"}, "spec": {"hard": {"vram": "24Gi"}},
    })  # fmt: skip
    db = default_database()

    def pod(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "quota",
                         "annotations": {"hcs.io/vendors": "nvidia"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"ai.compute/vram": "16Gi"}}}]},
        }  # fmt: skip

    body = pod("first")
    outcome = dra_patch(body, "quota", Templates(kube).ensure, quota=QuotaGate(kube, db))
    kube.create("/api/v1/namespaces/quota/pods", apply(copy.deepcopy(body), outcome.patch))

    def allocated() -> bool:
        claims = kube.get(f"{RESOURCE}/namespaces/quota/resourceclaims")["items"]
        return any((c.get("status") or {}).get("allocation") for c in claims)

    wait_for(allocated, "the first pod's claim allocated", timeout=60, interval=0.3)
    fresh = QuotaGate(kube, db)
    assert fresh.used("quota") == Amounts(16 * GiB, 0.0, 1)  # not the pod's charge as well
    # Without the charge on the pod, the claim alone: what the namespace holds.
    kube.patch("/api/v1/namespaces/quota/pods/first",
               {"metadata": {"annotations": {"hcs.io/quota-charge": None}}})  # fmt: skip
    assert fresh.used("quota") == Amounts(16 * GiB, 0.0, 1)
    with pytest.raises(Refused) as refused:
        dra_patch(pod("second"), "quota", Templates(kube).ensure, quota=fresh)
    assert str(refused.value) == (
        "ComputeQuota quota/limits: vram 16Gi used + 16Gi requested exceeds the limit 24Gi"
    )
    kube.close()
