"""RuntimeProfiles against a real kube-apiserver, kube-scheduler and hcs-scheduler-extender:
the CRD takes the shipped examples and refuses malformed profiles with its messages; a pod
naming a profile is bound with the chosen vendor's image and a version 3 assignment that
verifies with the node's key and carries the profile's env, command and args; a profile
with only an Ascend entry places its pod on the Ascend node; a pod naming a profile that does
not exist stays pending, unchanged, with the reason in kube-scheduler's Event; a pod naming
none is not touched (version 2); the extender's account may change the images of an unbound
pod naming a profile, and nothing else of it.

Two simulated nodes (no kubelet, no hcsd: what their syncers would write), one of A100s and
one of 910B3s."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.assignment import ANNOTATION, Assignment, verify
from hcsd.contract.keyring import Keyring, derive
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, API_VERSION, RUNTIME_PROFILES
from tests.cluster.conftest import _requirements, kustomized, secret_with
from tests.cluster.controlplane import REPO, ControlPlane, manifests
from tests.cluster.jobs import ExtenderProcess, simulated_node, start_extender

pytestmark = pytest.mark.slow

KEY = secrets.token_hex(32).encode()
KEYS = Keyring({"k1": KEY}, "k1")
GPU, NPU = "rp-gpu-node", "rp-npu-node"
EXAMPLES = sorted((REPO / "packaging" / "runtime-profiles").glob("*.yaml"))
PROFILES = f"/apis/{API_VERSION}/{RUNTIME_PROFILES}"
NAMESPACE = "rp"
PLACEHOLDER = "registry.example/code-only:1"

SERVE = {  # what the test pods name: an entrypoint swap on NVIDIA, env on Ascend
    "apiVersion": API_VERSION,
    "kind": "RuntimeProfile",
    "metadata": {"name": "serve-test"},
    "spec": {
        "description": "test serving",
        "codeMount": "/workspace",
        "runtimes": [
            {"vendor": "nvidia", "models": ["A100"], "image": "registry.example/trt:1",
             "command": ["tritonserver"], "args": ["--model-repository=/workspace/models"],
             "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
            {"vendor": "ascend", "image": "registry.example/cann:1",
             "env": [{"name": "ASCEND_RT_VISIBLE_DEVICES_FROM", "value": "hcs"}]},
        ],
    },
}  # fmt: skip
ASCEND_ONLY = {
    "apiVersion": API_VERSION,
    "kind": "RuntimeProfile",
    "metadata": {"name": "ascend-only"},
    "spec": {"runtimes": [{"vendor": "ascend", "image": "registry.example/cann:2"}]},
}


@pytest.fixture(scope="module")
def scheduling(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, Path, ExtenderProcess]]:
    binaries, etcd = _requirements()
    work = tmp_path_factory.mktemp("runtime-profiles")
    plane = ControlPlane(binaries, etcd, work).start()
    try:
        shipped = [d for d in manifests(*kustomized()) if d["kind"] != "Secret"]
        plane.apply(shipped + secret_with(KEYS))
        kube = plane.kube()
        simulated_node(kube, GPU, 2)
        simulated_node(kube, NPU, 2, vendor="ascend", model="Ascend910B3")
        plane.apply([SERVE, ASCEND_ONLY])
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": NAMESPACE}})  # fmt: skip
        extender = start_extender(plane, work, KEY)
        plane.start_scheduler(extender.url)
        yield plane, work, extender
    finally:
        plane.stop_process("extender")
        plane.stop()


def create_pod(kube: Kube, name: str, annotations: dict[str, str], **extra: Any) -> None:
    """A pod asking 8 GiB of one device in `main`, with a sidecar asking for none."""
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [
                {"name": "main", "image": PLACEHOLDER,
                 "resources": {"limits": {"ai.compute/vram": "8Gi"}},
                 "volumeMounts": [{"name": "code", "mountPath": "/workspace"}]},
                {"name": "sidecar", "image": "registry.example/sidecar:1"},
            ],
            "volumes": [{"name": "code", "image": {"reference": PLACEHOLDER}}],
            **extra,
        },
    })  # fmt: skip


def pod(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")


def wait_bound(kube: Kube, name: str, work: Path, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pod(kube, name)
        if found["spec"].get("nodeName"):
            return found
        time.sleep(0.1)
    log = (work / "extender.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"{name} not bound: {found.get('status')}\n{log}")


def verified(found: dict[str, Any]) -> Assignment:
    meta, node = found["metadata"], found["spec"]["nodeName"]
    return verify(meta["annotations"][ANNOTATION], derive(KEYS, node).keys, node=node,
                  pod_uid=meta["uid"], now=time.time(), max_age=3600)  # fmt: skip


def events(kube: Kube, name: str) -> list[str]:
    items = kube.list_all(f"/api/v1/namespaces/{NAMESPACE}/events")[0]
    return [f"{e['reason']}: {e['message']}" for e in items
            if e["involvedObject"].get("name") == name]  # fmt: skip


# --- the CRD ---------------------------------------------------------------------------------


def test_the_crd_takes_the_examples_and_shows_their_vendors(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, _, _ = scheduling
    kube = plane.kube()
    for path in EXAMPLES:
        obj = yaml.safe_load(path.read_text())
        kube.create(PROFILES, obj)  # dry-run would do; they are harmless here
    table = kube.request("GET", f"{PROFILES}/pytorch-2.5",
                         accept="application/json;as=Table;v=v1;g=meta.k8s.io")  # fmt: skip
    columns = [c["name"] for c in table["columnDefinitions"]]
    (row,) = table["rows"]
    shown = dict(zip(columns, row["cells"], strict=True))
    assert shown["NVIDIA"] == "nvcr.io/nvidia/pytorch:24.10-py3", shown
    assert shown["Ascend"].startswith("ascendai/pytorch:")
    assert shown["Hygon"].startswith("image.sourcefind.cn:5000/dcu/")
    assert shown["Cambricon"].startswith("yellow.hub.cambricon.com/pytorch/")
    assert shown["Code-Mount"] == "/workspace"
    assert shown["Description"].startswith("PyTorch training")
    table = kube.request("GET", f"{PROFILES}/ascend-only",
                         accept="application/json;as=Table;v=v1;g=meta.k8s.io")  # fmt: skip
    shown = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert (shown["NVIDIA"], shown["Ascend"]) == (None, "registry.example/cann:2"), shown


BAD = {
    "args without command": (
        {"vendor": "nvidia", "image": "a:1", "args": ["-x"]},
        "args need a command",
    ),
    "unknown vendor": ({"vendor": "intel", "image": "a:1"}, 'Unsupported value: "intel"'),
    "env twice": (
        {"vendor": "nvidia", "image": "a:1",
         "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "Duplicate value",
    ),
    "env name": (
        {"vendor": "nvidia", "image": "a:1", "env": [{"name": "A-B", "value": "1"}]},
        "spec.runtimes[0].env[0].name",
    ),
    "image too long": ({"vendor": "nvidia", "image": "a" * 513}, "Too long"),
    "image with a space": ({"vendor": "nvidia", "image": "a b"}, "spec.runtimes[0].image"),
    "no image": ({"vendor": "nvidia"}, "spec.runtimes[0].image: Required value"),
    "a vendor's device selection": (
        {"vendor": "ascend", "image": "a:1",
         "env": [{"name": "NCCL_DEBUG", "value": "1"},
                 {"name": "ASCEND_RT_VISIBLE_DEVICES", "value": "0"}]},
        "spec.runtimes[0].env[1].name: Forbidden: ASCEND_RT_VISIBLE_DEVICES is reserved: "
        "hcsd sets it itself",
    ),
    "the preload": (
        {"vendor": "nvidia", "image": "a:1", "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]},
        "LD_PRELOAD is reserved",
    ),
    "an HCS_ variable": (
        {"vendor": "nvidia", "image": "a:1", "env": [{"name": "HCS_CODE_DIR", "value": "/"}]},
        "HCS_CODE_DIR is reserved",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_the_crd_refuses_a_malformed_profile_saying_why(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess], case: str
) -> None:
    plane, _, _ = scheduling
    entry, message = BAD[case]
    body = {"apiVersion": API_VERSION, "kind": "RuntimeProfile",
            "metadata": {"name": "bad"}, "spec": {"runtimes": [entry]}}  # fmt: skip
    with pytest.raises(KubeError) as caught:
        plane.kube().create(PROFILES, body)
    print(f"{case}: {caught.value}")
    assert caught.value.status == 422 and message in str(caught.value), caught.value


# --- bind ------------------------------------------------------------------------------------


def test_a_pod_naming_a_profile_runs_the_vendors_image_with_a_signed_runtime(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, work, _ = scheduling
    kube = plane.kube()
    create_pod(kube, "serve-gpu", {ANNOTATION_RUNTIME_PROFILE: "serve-test",
                                   "hcs.io/vendors": "nvidia"})  # fmt: skip
    found = wait_bound(kube, "serve-gpu", work)
    assert found["spec"]["nodeName"] == GPU
    images = {c["name"]: c["image"] for c in found["spec"]["containers"]}
    assert images == {"main": "registry.example/trt:1", "sidecar": "registry.example/sidecar:1"}
    assignment = verified(found)  # signed for this node and pod, with the node's key
    assert set(assignment.runtime) == {"main"}  # only the container holding a device
    runtime = assignment.runtime["main"]
    assert runtime.profile == "serve-test" and runtime.image == images["main"]
    assert runtime.env == (("NCCL_DEBUG", "WARN"),)
    assert runtime.argv() == ("tritonserver", "--model-repository=/workspace/models")
    assert runtime.code_mount == "/workspace"
    assert '"v":3' in found["metadata"]["annotations"][ANNOTATION]


def test_a_profile_with_only_an_ascend_image_places_its_pods_on_the_ascend_node(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, work, _ = scheduling
    kube = plane.kube()
    for i in range(3):  # either node has room for each: only the profile decides
        create_pod(kube, f"npu-{i}", {ANNOTATION_RUNTIME_PROFILE: "ascend-only"})
    for i in range(3):
        found = wait_bound(kube, f"npu-{i}", work)
        assert found["spec"]["nodeName"] == NPU
        assert found["spec"]["containers"][0]["image"] == "registry.example/cann:2"
        runtime = verified(found).runtime["main"]
        assert (runtime.profile, runtime.env, runtime.argv()) == ("ascend-only", (), None)


def test_a_pod_naming_a_missing_profile_stays_pending_unchanged_saying_why(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, _, _ = scheduling
    kube = plane.kube()
    create_pod(kube, "missing", {ANNOTATION_RUNTIME_PROFILE: "no-such-profile"})
    reason = "RuntimeProfile 'no-such-profile' does not exist"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        said = events(kube, "missing")
        if any(reason in e for e in said):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no Event says {reason!r}: {said}")
    print(next(e for e in said if reason in e))
    found = pod(kube, "missing")
    assert not found["spec"].get("nodeName")
    assert found["spec"]["containers"][0]["image"] == PLACEHOLDER
    assert ANNOTATION not in (found["metadata"].get("annotations") or {})


def test_a_pod_naming_no_profile_is_not_touched(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    plane, work, _ = scheduling
    kube = plane.kube()
    create_pod(kube, "plain", {})
    found = wait_bound(kube, "plain", work)
    assert found["spec"]["containers"][0]["image"] == PLACEHOLDER
    assignment = verified(found)
    assert assignment.runtime == {} and '"v":2' in found["metadata"]["annotations"][ANNOTATION]


# --- what the extender's account may change ---------------------------------------------------


def test_the_extender_may_change_only_the_images_of_a_pending_pod_naming_a_profile(
    scheduling: tuple[ControlPlane, Path, ExtenderProcess],
) -> None:
    """admission-requeue.yaml, tried with the extender's credentials on pods no scheduler
    binds (a scheduler name nobody serves)."""
    plane, _, _ = scheduling
    admin, extender = plane.kube(), plane.kube("extender")
    create_pod(admin, "opted-in", {ANNOTATION_RUNTIME_PROFILE: "serve-test"},
               schedulerName="nobody")  # fmt: skip
    create_pod(admin, "opted-out", {}, schedulerName="nobody")
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    strategic = "application/strategic-merge-patch+json"

    def patch(name: str, body: dict[str, Any]) -> dict[str, Any]:
        return extender.request("PATCH", f"{path}/{name}", body=body, content_type=strategic)

    tolerations = pod(admin, "opted-in")["spec"].get("tolerations") or []
    done = patch("opted-in", {"spec": {"containers": [{"name": "main", "image": "x.example/y:1"}]}})
    assert done["spec"]["containers"][0]["image"] == "x.example/y:1"
    refused = {
        "the image of a pod naming no profile": (
            "opted-out", {"spec": {"containers": [{"name": "main", "image": "x.example/y:1"}]}}),
        "a toleration": ("opted-in", {"spec": {"tolerations": [*tolerations,
                                                               {"operator": "Exists"}]}}),
        "a deadline": ("opted-in", {"spec": {"activeDeadlineSeconds": 5}}),
        "the image of a container asking for no ai.compute/*": (
            "opted-in", {"spec": {"containers": [{"name": "sidecar", "image": "x.example/y:1"}]}}),
        "the profile annotation": (
            "opted-out", {"metadata": {"annotations": {ANNOTATION_RUNTIME_PROFILE: "x"}}}),
        "a label with the image": ("opted-in", {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"containers": [{"name": "main", "image": "x.example/z:1"}]}}),
    }  # fmt: skip
    for what, (name, body) in refused.items():
        with pytest.raises(KubeError) as caught:
            patch(name, body)
        print(f"{what}: {caught.value}")
        assert caught.value.status == 403, (what, caught.value)
    assert pod(admin, "opted-in")["spec"]["containers"][0]["image"] == "x.example/y:1"
    extender.close()
