"""The admission webhook in DRA mode, registered by the chart (`mode: dra`), called by the
real kube-apiserver 1.36.

`helm install --set mode=dra` makes the certificate, the Service, the configuration and the
webhook's ClusterRole; the webhook runs here as a process with the Secret's files and a token
of its own service account (what the Deployment mounts), so RBAC is the chart's. Then: a pod
asking for `ai.compute/vram: 16Gi` comes out with the claim and no ai.compute/* left, its
ResourceClaimTemplate exists with the spec the translation makes (the API server's validation
accepted it: CEL selectors, firstAvailable, capacity requests and constraints included); a
second pod of the shape reuses it; malformed requests are refused with their reason and leave
nothing behind; a dry run creates nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from hcsd.cluster.claim_shapes import claim_spec, template_name
from hcsd.cluster.claim_templates import Templates
from hcsd.cluster.demand import demand_of
from hcsd.cluster.kube import Kube, KubeError
from hcsd.cluster.webhook_dra import TemplateConflict
from hcsd.profiles.database import default_database
from tests.cluster.controlplane import request_token, token_kubeconfig
from tests.cluster.helmchart import Helm, helm, start_webhook

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.slow

TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates"


@pytest.fixture(scope="module")
def webhook(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    helm.install("--set", "mode=dra")
    directory = tmp_path_factory.mktemp("webhook-dra")
    admin = helm.plane.kube()
    token = request_token(admin, "hcs-admission-webhook")
    for namespace in ("team", "other", "refused", "dry"):
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": namespace}})  # fmt: skip
    admin.close()
    config = token_kubeconfig(
        directory / "webhook.kubeconfig", helm.plane.server, helm.plane.work / "certs", token
    )
    start_webhook(helm, directory, "--mode", "dra", "--kubeconfig", str(config))
    try:
        yield directory
    finally:
        helm.plane.stop_process("webhook")


def pod_body(
    name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"cpu": "1", **limits}}}]},
    }  # fmt: skip


def create(kube: Kube, namespace: str, body: dict[str, Any], **query: str) -> dict[str, Any]:
    return kube.request(
        "POST", f"/api/v1/namespaces/{namespace}/pods", query=list(query.items()), body=body
    )


def templates(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    found = kube.get(TEMPLATES.format(namespace))["items"]
    return {t["metadata"]["name"]: t for t in found}


def expected(body: dict[str, Any]) -> dict[str, Any]:
    """The claim spec the translation makes for `body` (what the webhook must have sent)."""
    wanted = demand_of(body)
    assert wanted is not None
    return claim_spec(wanted, default_database())


def test_a_16gi_pod_gets_a_claim_from_a_template_a_second_pod_reuses(
    helm: Helm, webhook: Path
) -> None:
    kube = helm.plane.kube()
    body = pod_body("first", {"ai.compute/vram": "16Gi"})
    pod = create(kube, "team", body)
    name = template_name(expected(body))
    assert pod["spec"]["resourceClaims"] == [
        {"name": "hcs-accelerator", "resourceClaimTemplateName": name}
    ]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"cpu": "1"}
    assert container["resources"]["claims"] == [{"name": "hcs-accelerator", "request": "r0"}]
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    made = templates(kube, "team")
    assert list(made) == [name]
    request = made[name]["spec"]["spec"]["devices"]["requests"][0]
    assert request["name"] == "r0"
    assert request["exactly"]["deviceClassName"] == "ai.compute"
    assert request["exactly"]["count"] == 1
    assert request["exactly"]["capacity"] == {"requests": {"memory": "16Gi", "compute": "0"}}
    assert made[name]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == (
        "hcs-admission-webhook"
    )
    # A second pod of the shape (in other words: 16384Mi) reuses it; another namespace gets
    # its own (a pod can only use a template of its namespace).
    second = create(kube, "team", pod_body("second", {"ai.compute/vram": "16384Mi"}))
    assert second["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == name
    assert list(templates(kube, "team")) == [name]
    create(kube, "other", pod_body("third", {"ai.compute/vram": "16Gi"}))
    assert list(templates(kube, "other")) == [name]
    kube.close()


def test_pods_of_a_new_shape_at_once_share_one_template(helm: Helm, webhook: Path) -> None:
    """Created together (the webhook answers two at once): each sees the template missing
    or being made, one create wins, the others' AlreadyExists is success."""
    body = pod_body("race", {"ai.compute/vram": "3Gi"})
    made: list[str] = []

    def one(number: int) -> None:
        kube = helm.plane.kube()
        named = {**body, "metadata": {**body["metadata"], "name": f"race-{number}"}}
        pod = create(kube, "other", named)
        made.append(pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"])
        kube.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    name = template_name(expected(body))
    assert made == [name] * 6
    kube = helm.plane.kube()
    assert name in templates(kube, "other")
    kube.close()


SHAPES = {
    "100 TFLOPS, any model: 8 alternatives with CEL selectors": (
        {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"}, {}
    ),
    "the issue's list: A100, 910B3 or 2 MLU370": (
        {"ai.compute/vram": "16Gi", "ai.compute/tflops-fp16": "100"},
        {"hcs.io/models": "A100,Ascend910B3,MLU370-X8"},
    ),
    "2 devices on one link domain": (
        {"ai.compute/devices": "2", "ai.compute/vram": "40Gi"},
        {"hcs.io/topology-preference": "high-bandwidth", "hcs.io/vendors": "nvidia,ascend"},
    ),
    "a named model with substitution": (
        {"ai.compute/vram": "16Gi"},
        {"hcs.io/models": "A100", "hcs.io/allow-substitution": "true"},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("limits", "annotations"), SHAPES.values(), ids=SHAPES.keys())
def test_every_kind_of_template_passes_the_api_servers_validation(
    helm: Helm, webhook: Path, limits: dict[str, str], annotations: dict[str, str]
) -> None:
    kube = helm.plane.kube()
    number = len(templates(kube, "team"))
    body = pod_body(f"shape-{number}", limits, annotations)
    pod = create(kube, "team", body)
    name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    spec = expected(body)
    assert name == template_name(spec)
    stored = templates(kube, "team")[name]["spec"]["spec"]
    request = stored["devices"]["requests"][0]
    sent = spec["devices"]["requests"][0]
    if "firstAvailable" in sent:
        assert [a["name"] for a in request["firstAvailable"]] == [
            a["name"] for a in sent["firstAvailable"]
        ]
        assert [a["selectors"] for a in request["firstAvailable"]] == [
            a["selectors"] for a in sent["firstAvailable"]
        ]
    assert stored["devices"].get("constraints") == spec["devices"].get("constraints")
    # Another replica racing for it: its read finds nothing, its create gets the API server's
    # AlreadyExists, and the template read back (with the server's defaults) is the same spec.
    racing = Templates(LateReads(kube))
    assert racing.ensure("team", name, spec) is False
    with pytest.raises(TemplateConflict):
        Templates(LateReads(kube)).ensure("team", name, {"devices": {"requests": []}})
    kube.close()


class LateReads:
    """The real API, whose first read of a template answers 404 (a replica that looked just
    before another one created it)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.reads = 0

    def get(self, path: str) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            raise KubeError(404, "NotFound", path)
        return self.kube.get(path)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.kube.create(path, body)


REFUSED = {
    # A quantity Kubernetes cannot read never reaches a webhook: the API server refuses it.
    "bad quantity": (
        {"ai.compute/devices": "1500m"}, {}, "ai.compute/devices must be a whole number 1..64"
    ),
    "vram over any device": (
        {"ai.compute/vram": "1Ti"}, {}, "per device is more than any allowed device has"
    ),
    "unknown vendor": (
        {"ai.compute/vram": "8Gi"}, {"hcs.io/vendors": "intel"}, "unknown vendor 'intel'"
    ),
    "conflicting annotations": (
        {"ai.compute/vram": "8Gi"},
        {"hcs.io/vendors": "nvidia", "hcs.io/models": "Ascend910B3"},
        "hcs.io/models and hcs.io/vendors allow no model together",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("limits", "annotations", "message"), REFUSED.values(),
                         ids=REFUSED.keys())  # fmt: skip
def test_malformed_requests_are_refused_with_the_reason_and_leave_nothing(
    helm: Helm, webhook: Path, limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    kube = helm.plane.kube()
    with pytest.raises(KubeError) as refused:
        create(kube, "refused", pod_body("bad", limits, annotations))
    assert "denied the request" in str(refused.value) and message in str(refused.value)
    assert templates(kube, "refused") == {}
    kube.close()


QUOTAS = "/apis/hcs.io/v1alpha1/namespaces/{}/computequotas"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims"


def quota_namespace(kube: Kube, namespace: str, **hard: object) -> None:
    """A namespace with the ComputeQuota `limits` of `hard`."""
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip
    kube.create(QUOTAS.format(namespace), {
        "apiVersion": "hcs.io/v1alpha1", "kind": "ComputeQuota",
        "metadata": {"name": "limits", "namespace": namespace}, "spec": {"hard": hard},
    })  # fmt: skip


def pod_names(kube: Kube, namespace: str) -> list[str]:
    found = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return sorted(p["metadata"]["name"] for p in found)


def test_over_the_compute_quota_refused_with_the_figures_and_admitted_once_raised(
    helm: Helm, webhook: Path
) -> None:
    """vram 20Gi: a 16Gi pod is admitted (charged on it); an 8Gi pod right after it (its
    claim not allocated: no scheduler runs here) is refused with the extender's wording and
    leaves no pod and no template; with the quota raised to 24Gi it is admitted."""
    kube = helm.plane.kube()
    quota_namespace(kube, "quota", vram="20Gi")
    first = create(kube, "quota", pod_body("first", {"ai.compute/vram": "16Gi"}))
    assert "hcs.io/quota-charge" in first["metadata"]["annotations"]
    with pytest.raises(KubeError) as refused:
        create(kube, "quota", pod_body("second", {"ai.compute/vram": "8Gi"}))
    assert refused.value.status == 403
    assert (
        'admission webhook "scheduler-name.hcs.io" denied the request: ComputeQuota '
        "quota/limits: vram 16Gi used + 8Gi requested exceeds the limit 20Gi"
    ) in str(refused.value)
    assert pod_names(kube, "quota") == ["first"]
    assert list(templates(kube, "quota")) == [first["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"]]  # fmt: skip
    kube.patch(QUOTAS.format("quota") + "/limits", {"spec": {"hard": {"vram": "24Gi"}}})
    create(kube, "quota", pod_body("second", {"ai.compute/vram": "8Gi"}))
    assert pod_names(kube, "quota") == ["first", "second"]
    kube.close()


def test_allocated_claims_count_against_the_quota(helm: Helm, webhook: Path) -> None:
    """A claim of the namespace holding one HCS device (allocated: the status a scheduler
    writes, here by the test) uses the namespace's only device; a pod is refused."""
    kube = helm.plane.kube()
    quota_namespace(kube, "quota-claims", devices=1)
    claims = CLAIMS.format("quota-claims")
    made = kube.create(claims, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "quota-claims"},
        "spec": {"devices": {"requests": [{"name": "r0", "exactly": {
            "deviceClassName": "ai.compute"}}]}},
    })  # fmt: skip
    made["status"] = {"allocation": {"devices": {"results": [
        {"request": "r0", "driver": "compute.hcs.io", "pool": "node-a", "device": "nvidia-0"}
    ]}}}  # fmt: skip
    kube.replace(f"{claims}/held/status", made)
    with pytest.raises(KubeError) as refused:
        create(kube, "quota-claims", pod_body("over", {"ai.compute/vram": "1Gi"}))
    assert "ComputeQuota quota-claims/limits: devices 1 used + 1 requested exceeds the limit 1" in (
        str(refused.value)
    )
    kube.request("DELETE", f"{claims}/held")
    create(kube, "quota-claims", pod_body("fits", {"ai.compute/vram": "1Gi"}))
    kube.close()


def test_pods_created_at_once_where_only_one_fits_one_is_admitted(
    helm: Helm, webhook: Path
) -> None:
    """devices 1: four pods created together, none of them allocated yet; the webhook's
    decisions are serialized and each counts the ones admitted before it."""
    quota_namespace(helm.plane.kube(), "quota-race", devices=1)
    outcomes: list[str] = []

    def one(number: int) -> None:
        kube = helm.plane.kube()
        try:
            create(kube, "quota-race", pod_body(f"race-{number}", {"ai.compute/vram": "2Gi"}))
            outcomes.append("admitted")
        except KubeError as e:
            outcomes.append("refused" if "exceeds the limit 1" in str(e) else str(e))
        kube.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["admitted", "refused", "refused", "refused"]
    kube = helm.plane.kube()
    assert len(pod_names(kube, "quota-race")) == 1
    kube.close()


def test_a_dry_run_creates_no_template_and_the_webhook_down_refuses(
    helm: Helm, webhook: Path
) -> None:
    kube = helm.plane.kube()
    pod = create(kube, "dry", pod_body("dry", {"ai.compute/vram": "2Gi"}), dryRun="All")
    assert pod["spec"]["resourceClaims"][0]["name"] == "hcs-accelerator"
    assert templates(kube, "dry") == {}
    log = (webhook / "webhook.log").read_text()
    assert "claim from ResourceClaimTemplate" in log
    helm.plane.stop_process("webhook")
    with pytest.raises(KubeError) as refused:
        create(kube, "dry", pod_body("down", {"ai.compute/vram": "2Gi"}))
    assert "scheduler-name.hcs.io" in str(refused.value)
    assert create(kube, "dry", pod_body("plain", {}))["spec"].get("resourceClaims") is None
    kube.close()
