"""The webhook in DRA mode (hcsd/cluster/webhook_dra.py, claim_templates.py): the patch that
turns `ai.compute/*` into a claim, the refusals, dry runs, and making sure of the template
under races (an in-memory API standing in for the API server's answers; the real one is in
tests/cluster/test_webhook_dra.py).
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from hcsd.cluster.claim_quota import QuotaGate
from hcsd.cluster.claim_templates import Templates
from hcsd.cluster.kube import KubeError
from hcsd.cluster.profile_gate import ProfileReader
from hcsd.cluster.webhook import Rule, review
from hcsd.cluster.webhook_dra import TemplateConflict, TemplateUnavailable
from hcsd.cluster.webhook_server import serve_webhook
from hcsd.profiles.database import default_database
from tests.unit.test_claim_quota import Blocking

TEMPLATE = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates"


class Api:
    """What the API server answers for templates: 404, 409, or `fail` for every call."""

    def __init__(self, fail: int = 0) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.fail = fail
        self.created: list[str] = []
        self.before_create: dict[str, Any] | None = None  # another replica's, made first

    def get(self, path: str) -> dict[str, Any]:
        if self.fail:
            raise KubeError(self.fail, "InternalError", "etcd is away")
        if path not in self.objects:
            raise KubeError(404, "NotFound", path)
        return self.objects[path]

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        where = f"{path}/{body['metadata']['name']}"
        if self.before_create is not None:
            self.objects[where], self.before_create = self.before_create, None
        if where in self.objects:
            raise KubeError(409, "AlreadyExists", where)
        self.objects[where] = copy.deepcopy(dict(body))
        self.created.append(where)
        return self.objects[where]


def pod(containers: list[dict[str, Any]], **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": containers},
    }  # fmt: skip


def container(name: str = "main", **limits: str) -> dict[str, Any]:
    names = {k.replace("_", "-"): v for k, v in limits.items()}
    return {"name": name, "resources": {"limits": {f"ai.compute/{k}": v for k, v in names.items()},
                                        "requests": {"cpu": "1"}}}  # fmt: skip


def call(api: Api, obj: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "team", "object": obj, **extra},
    }  # fmt: skip
    rule = Rule(mode="dra", ensure=Templates(api).ensure)
    response: dict[str, Any] = review(json.dumps(body).encode(), rule)["response"]
    return response


def apply(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add`, `remove` and `replace` (all the webhook and the profile gate write;
    `test` is the API server's to check)."""
    result = copy.deepcopy(document)
    for op in patch:
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]
        ]
        target: Any = result
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        key: Any = int(last) if isinstance(target, list) and last != "-" else last
        if op["op"] == "remove":
            del target[key]
        elif last == "-":
            target.append(op["value"])
        elif isinstance(target, list) and op["op"] == "add":
            target.insert(key, op["value"])
        else:
            target[key] = op["value"]
    return result


def patched(response: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True, response
    assert response["patchType"] == "JSONPatch"
    return apply(obj, json.loads(base64.b64decode(response["patch"])))


def test_a_vram_request_becomes_a_claim_on_a_template_made_once() -> None:
    api = Api()
    obj = pod([container(vram="16Gi"), {"name": "sidecar"}, container("second", devices="2")])
    out = patched(call(api, obj), obj)
    (entry,) = out["spec"]["resourceClaims"]
    assert entry["name"] == "hcs-accelerator"
    first, sidecar, second = out["spec"]["containers"]
    assert first["resources"] == {
        "limits": {}, "requests": {"cpu": "1"},
        "claims": [{"name": "hcs-accelerator", "request": "r0"}],
    }  # fmt: skip
    assert second["resources"]["claims"] == [{"name": "hcs-accelerator", "request": "r1"}]
    assert sidecar == {"name": "sidecar"}
    assert out["spec"].get("schedulerName") is None  # kube-scheduler's own DRA allocator
    assert api.created == [f"{TEMPLATE}/{entry['resourceClaimTemplateName']}"]
    template = api.objects[api.created[0]]
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "hcs-admission-webhook"
    }
    requests = template["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["r0", "r1"]
    # A second pod of the shape: the same template, nothing created.
    again = patched(call(api, obj), obj)
    assert again["spec"]["resourceClaims"] == [entry] and len(api.created) == 1


def test_claims_and_claim_entries_the_pod_has_are_kept() -> None:
    obj = pod([container(vram="1Gi")])
    obj["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "nic"}]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "nic"}]
    out = patched(call(Api(), obj), obj)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["nic", "hcs-accelerator"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "nic"}, {"name": "hcs-accelerator", "request": "r0"}
    ]  # fmt: skip


def test_a_dry_run_creates_no_template() -> None:
    api = Api()
    obj = pod([container(vram="16Gi")])
    out = patched(call(api, obj, dryRun=True), obj)
    assert out["spec"]["resourceClaims"] and api.created == []


def test_opted_out_and_plain_pods_are_left_alone() -> None:
    api = Api()
    opted = pod([container(vram="16Gi")])
    opted["metadata"]["labels"] = {"hcs.io/webhook": "disabled"}
    plain = pod([{"name": "main", "resources": {"limits": {"cpu": "1"}}}])
    for obj in (opted, plain):
        response = call(api, obj)
        assert response["allowed"] is True and "patch" not in response
    assert api.created == []


REFUSALS = {
    "bad quantity": ([container(vram="16Zi")], {}, "container main: "),
    "unknown vendor": (
        [container(vram="16Gi")], {"hcs.io/vendors": "intel"}, "unknown vendor 'intel'"
    ),
    "vram over any device": (
        [container(vram="1Ti")], {}, "more than any allowed device has"
    ),
    "conflicting annotations": (
        [container(vram="8Gi")],
        {"hcs.io/vendors": "nvidia", "hcs.io/models": "Ascend910B3"},
        "hcs.io/models and hcs.io/vendors allow no model together",
    ),
    "unknown resource": (
        [container(vram="8Gi", fp64="1")], {}, "ai.compute/fp64 is not a resource HCS knows"
    ),
    "bad substitution flag": (
        [container(vram="8Gi")], {"hcs.io/allow-substitution": "yes"},
        'hcs.io/allow-substitution must be "true" or "false"',
    ),
}  # fmt: skip


@pytest.mark.parametrize(("containers", "annotations", "message"), REFUSALS.values(),
                         ids=REFUSALS.keys())  # fmt: skip
def test_malformed_requests_are_refused_with_the_reason(
    containers: list[dict[str, Any]], annotations: dict[str, str], message: str
) -> None:
    api = Api()
    response = call(api, pod(containers, **annotations))
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert api.created == []  # nothing left behind


def test_init_containers_and_a_taken_claim_name_are_refused() -> None:
    obj = pod([{"name": "main"}])
    obj["spec"]["initContainers"] = [container(vram="1Gi")]
    assert "init container" in call(Api(), obj)["status"]["message"]
    obj = pod([container(vram="1Gi")])
    obj["spec"]["resourceClaims"] = [{"name": "hcs-accelerator", "resourceClaimName": "x"}]
    assert "already has an entry named hcs-accelerator" in call(Api(), obj)["status"]["message"]


PROFILE_PATH = "/apis/hcs.io/v1alpha1/runtimeprofiles/pytorch-2.5"
PROFILE = {
    "metadata": {"name": "pytorch-2.5"},
    "spec": {"runtimes": [
        {"vendor": "ascend", "image": "example.com/ascend/pytorch:1"},
        {"vendor": "nvidia", "models": ["A100"], "image": "example.com/ngc/pytorch:1"},
    ]},
}  # fmt: skip


def profile_call(api: Api, obj: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "team", "object": obj},
    }  # fmt: skip
    rule = Rule(mode="dra", ensure=Templates(api).ensure, runtime_profiles=ProfileReader(api))
    response: dict[str, Any] = review(json.dumps(body).encode(), rule)["response"]
    return response


def test_a_runtime_profile_pod_is_gated_with_a_claim_narrowed_to_the_profile() -> None:
    """The claim asks only for devices the profile has an image for (an Ascend chip, or an
    A100), and kube-scheduler may not see the pod before the gate controller set its image."""
    api = Api()
    api.objects[PROFILE_PATH] = copy.deepcopy(PROFILE)
    obj = pod([container(vram="16Gi")], **{"hcs.io/runtime-profile": "pytorch-2.5"})
    answer = profile_call(api, obj)
    assert answer["allowed"] is True, answer
    patched = apply(obj, json.loads(base64.b64decode(answer["patch"])))
    assert patched["spec"]["schedulingGates"] == [{"name": "hcs.io/runtime-profile"}]
    (made,) = api.created
    # its claims carry the profile's name for the kubelet plugin
    assert api.objects[made]["spec"]["metadata"] == {
        "annotations": {"hcs.io/runtime-profile": "pytorch-2.5"}
    }
    subs = api.objects[made]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert [s["deviceClassName"] for s in subs] == [
        "ascend.compute.hcs.io",
        "nvidia.compute.hcs.io",
    ]
    assert "a100-sxm4-80gb" in subs[1]["selectors"][0]["cel"]["expression"]
    # without the profile, the same request is one alternative of any vendor
    plain = call(Api(), pod([container(vram="16Gi")]))
    assert "schedulingGates" not in json.dumps(json.loads(base64.b64decode(plain["patch"])))


def test_a_pod_naming_a_missing_or_unreadable_profile_is_refused() -> None:
    obj = pod([container(vram="16Gi")], **{"hcs.io/runtime-profile": "pytorch-2.5"})
    answer = profile_call(Api(), obj)
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert "RuntimeProfile 'pytorch-2.5' does not exist" in answer["status"]["message"]
    answer = profile_call(Api(fail=500), obj)
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    assert "failed to read RuntimeProfile pytorch-2.5" in answer["status"]["message"]
    api = Api()
    api.objects[PROFILE_PATH] = copy.deepcopy(PROFILE)
    tflops = pod([container(tflops_fp16="100")], **{"hcs.io/runtime-profile": "pytorch-2.5"})
    tflops["metadata"]["annotations"]["hcs.io/vendors"] = "cambricon"
    answer = profile_call(api, tflops)
    assert answer["allowed"] is False
    assert "no allowed model" in answer["status"]["message"]


def test_the_api_server_away_refuses_with_a_retryable_reason() -> None:
    response = call(Api(fail=500), pod([container(vram="1Gi")]))
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert "failed to read ResourceClaimTemplate" in response["status"]["message"]


SPEC = {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": "ai.compute"}}]}}


def test_a_race_lost_to_another_replica_is_success_when_the_spec_matches() -> None:
    api = Api()
    theirs = {"metadata": {"name": "hcs-x"}, "spec": {"spec": copy.deepcopy(SPEC)}}
    theirs["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 1  # a default
    api.before_create = theirs
    assert Templates(api).ensure("team", "hcs-x", SPEC) is False
    assert api.created == []


def test_a_template_of_the_name_with_another_spec_is_refused_not_used() -> None:
    api = Api()
    other = copy.deepcopy(SPEC)
    other["devices"]["requests"][0]["exactly"]["deviceClassName"] = "something-else"
    api.before_create = {"metadata": {"name": "hcs-x"}, "spec": {"spec": other}}
    with pytest.raises(TemplateConflict, match="exists with another spec"):
        Templates(api).ensure("team", "hcs-x", SPEC)
    with pytest.raises(TemplateConflict):  # and found by the read next time
        Templates(api).ensure("team", "hcs-x", SPEC)
    with pytest.raises(TemplateUnavailable):
        Templates(Api(fail=503)).ensure("team", "hcs-x", SPEC)


def test_extender_mode_never_loads_the_kubernetes_client() -> None:
    """Only DRA mode talks to the API server: the extender-mode webhook stays as small as it
    was (its memory limit is sized on it: hcsd/cluster/webhook_server.py)."""
    code = "import sys, hcsd.cluster.webhook_server; print('kubernetes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def review_body(namespace: str, uid: str) -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": namespace, "dryRun": True,
                    "object": pod([container(vram="1Gi")])},
    }).encode()  # fmt: skip


def test_a_namespace_whose_quota_is_slow_to_read_holds_up_no_other_namespace() -> None:
    """The API server is one caller for every tenant. A tenant whose namespace makes the
    ComputeQuota's reads slow (thousands of big pods) has one review of it in progress and
    two waiting; its fourth is refused as busy at once, and another namespace's pod is
    answered at once meanwhile, over the real HTTP server: the review slots bound only the
    parsing, the API calls wait outside them."""
    api = Blocking()
    gate = QuotaGate(api, default_database(), waiting=2, turn_wait=10.0)
    rule = Rule(mode="dra", ensure=Templates(Api()).ensure, quota=gate)
    served = serve_webhook("127.0.0.1", 0, None, rule)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    address = ("127.0.0.1", served.server_address[1])
    answers: dict[str, dict[str, Any]] = {}

    def send(namespace: str, uid: str) -> None:
        connection = http.client.HTTPConnection(*address, timeout=20)
        try:
            connection.request("POST", "/mutate", review_body(namespace, uid))
            reply = connection.getresponse()
            assert reply.status == 200, reply.read()
            answers[uid] = json.loads(reply.read())["response"]
        finally:
            connection.close()

    try:
        held = [threading.Thread(target=send, args=("slow", f"s{i}")) for i in range(3)]
        held[0].start()
        assert api.entered.wait(10)
        for thread in held[1:]:
            thread.start()
        deadline = time.monotonic() + 10
        while gate._turns["slow"].queued < 3:
            assert time.monotonic() < deadline, "the two did not queue behind the first"
            time.sleep(0.01)
        started = time.monotonic()
        send("slow", "s3")
        assert answers["s3"]["allowed"] is False
        assert answers["s3"]["status"]["code"] == 429
        assert answers["s3"]["status"]["reason"] == "TooManyRequests"
        send("team", "t0")
        assert answers["t0"]["allowed"] is True and "patch" in answers["t0"]
        assert time.monotonic() - started < 1.5
        api.release.set()
        for thread in held:
            thread.join(20)
        assert [answers[f"s{i}"]["allowed"] for i in range(3)] == [True] * 3
    finally:
        api.release.set()
        served.shutdown()
        served.server_close()


def test_a_busy_answer_tells_the_client_when_to_retry() -> None:
    """429 with details.retryAfterSeconds: the API server sends it on as Retry-After."""
    api = Blocking()
    api.release.set()
    rule = Rule(mode="dra", ensure=Templates(Api()).ensure,
                quota=QuotaGate(api, default_database(), deadline=-1.0))  # fmt: skip
    response = review(review_body("slow", "u-9"), rule)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 429
    assert response["status"]["details"] == {"retryAfterSeconds": 1}
