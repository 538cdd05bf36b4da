"""The mutating admission webhook's decision: which pods go to HCS's scheduler (extender
mode), or which claim template they use (DRA mode, `Rule.mode`: webhook_dra.py and
docs/dra.md; the rest of this text is about extender mode).

A pod that asks for any `ai.compute/*` resource (requests or limits, in a container or an
init container) and names no scheduler of its own (`spec.schedulerName` absent, empty or
`default-scheduler`) is sent to the scheduler whose profile calls the extender
(`hcs-scheduler` in the chart): the answer is a JSON patch setting `spec.schedulerName`.
Every other pod is allowed unchanged, and so is a pod carrying the opt-out label
(`hcs.io/webhook: disabled`; the chart's objectSelector and namespaceSelector leave such
pods and namespaces out before the API server calls at all: this is the same rule once more,
for a configuration that lost its selectors).

The one pod refused is a pod sent to HCS's scheduler whose `hcs.io/job` (annotation or label)
is not a DNS-1123 label of at most 63 characters: the extender would treat it as of no job
(`fabric_jobs.job_of`), so its owner hears now rather than finding the job spread over fabric
domains; the message names the rule, never the value. Otherwise the webhook only ever fills
in a scheduler name. A body that is
not an AdmissionReview the API server would send raises `ReviewError`, which the server
answers with 400 and the reason; the API server then applies the configuration's
failurePolicy (docs/helm.md says what each means).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.fabric_jobs import valid_job_name
from hcsd.cluster.profile_gate import Profiles
from hcsd.cluster.webhook_dra import DraPlan, Ensure, Gate, Refused, dra_carry_out, dra_plan
from hcsd.contract.dra import MODE_DRA, MODE_EXTENDER
from hcsd.contract.names import JOB, MANAGED_RESOURCES, SCHEDULER_NAME, WEBHOOK_OPT_OUT_LABEL
from hcsd.profiles.database import ProfileDatabase

__all__ = [
    "DEFAULT_SCHEDULER",
    "OPT_OUT_LABEL",
    "OPT_OUT_VALUE",
    "Pending",
    "ReviewError",
    "Rule",
    "answer",
    "asks_for_compute",
    "finish",
    "parse_review",
    "prepare",
    "review",
    "reviewed",
]

DEFAULT_SCHEDULER = "default-scheduler"
OPT_OUT_LABEL = WEBHOOK_OPT_OUT_LABEL
OPT_OUT_VALUE = "disabled"
RESOURCE_PREFIX = MANAGED_RESOURCES[0].split("/")[0] + "/"  # "ai.compute/"
REVIEW_VERSION = "admission.k8s.io/v1"


class ReviewError(ValueError):
    """A body that is not an AdmissionReview of the kind the API server sends (permanent)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """What the webhook does: the scheduler name it sets (extender mode), or the claim
    template it makes sure of and refers to (DRA mode: `ensure` is required)."""

    scheduler: str = SCHEDULER_NAME
    mode: str = MODE_EXTENDER
    ensure: Ensure | None = None
    profiles: ProfileDatabase | None = None  # None: the one shipped
    quota: Gate | None = None  # DRA mode: ComputeQuota at admission (claim_quota.py)
    runtime_profiles: Profiles | None = None  # DRA mode: reads RuntimeProfiles by name

    def __post_init__(self) -> None:
        if self.mode not in (MODE_EXTENDER, MODE_DRA):
            raise ValueError(f"mode {self.mode!r} is not {MODE_EXTENDER} or {MODE_DRA}")
        if self.mode == MODE_DRA and self.ensure is None:
            raise ValueError("DRA mode needs a way to make sure of claim templates")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ReviewError(f"{where} is not an object")
    return value


def _optional_mapping(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return {} if value is None else _mapping(value, f"{where}.{key}")


def asks_for_compute(spec: Mapping[str, Any]) -> bool:
    """Whether any container or init container names an `ai.compute/*` resource in its
    requests or limits. ReviewError when the spec is not shaped like a pod's."""
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind) or []
        if not isinstance(containers, list):
            raise ReviewError(f"spec.{kind} is not a list")
        for i, container in enumerate(containers):
            where = f"spec.{kind}[{i}]"
            resources = _optional_mapping(_mapping(container, where), "resources", where)
            for field in ("requests", "limits"):
                amounts = _optional_mapping(resources, field, f"{where}.resources")
                if any(str(name).startswith(RESOURCE_PREFIX) for name in amounts):
                    return True
    return False


def bad_job_name(pod: Mapping[str, Any]) -> str:
    """Why the pod's `hcs.io/job` is refused ("" when absent or valid); never quotes it."""
    metadata = pod.get("metadata") or {}
    for where in ("annotations", "labels"):
        name = (metadata.get(where) or {}).get(JOB) if isinstance(metadata, dict) else None
        if name is not None and not (isinstance(name, str) and valid_job_name(name)):
            length = len(name) if isinstance(name, str) else 0
            return (
                f"{JOB} ({where[:-1]}, {length} characters) must be a DNS-1123 label: at most "
                "63 lowercase letters, digits and '-', starting and ending with a letter or digit"
            )
    return ""


def _patch_for(pod: Mapping[str, Any], rule: Rule) -> list[dict[str, Any]] | None:
    """The JSON patch for `pod`, or None to leave it as it is."""
    metadata = _optional_mapping(pod, "metadata", "request.object")
    labels = _optional_mapping(metadata, "labels", "request.object.metadata")
    if labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
        return None
    spec = _mapping(pod.get("spec"), "request.object.spec")
    named = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if not isinstance(named, str):
        raise ReviewError("request.object.spec.schedulerName is not a string")
    if named != DEFAULT_SCHEDULER or not asks_for_compute(spec):
        return None
    # "add" replaces a member that exists (RFC 6902), so one op covers absent and explicit.
    return [{"op": "add", "path": "/spec/schedulerName", "value": rule.scheduler}]


@dataclass(frozen=True, slots=True)
class Pending:
    """An answer whose calls to the API server are still to make (DRA mode: the quota's
    decision and the template). It holds the plan, not the pod, so the review's parsed
    body can go first: a slot bounds parsing, the calls wait on the API server."""

    response: dict[str, Any]
    namespace: str
    plan: DraPlan
    dry_run: bool


def prepare(request: Mapping[str, Any], rule: Rule) -> dict[str, Any] | Pending:
    """The AdmissionResponse for one AdmissionRequest, or what is still to do for it
    (`finish`); ReviewError: malformed. Calls no API but a RuntimeProfile's read."""
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    kind = _optional_mapping(request, "kind", "request")
    if kind.get("group", "") != "" or kind.get("kind") != "Pod":
        return response  # registered for pods only; anything else passes untouched
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return response
    obj = _mapping(request.get("object"), "request.object")
    if rule.mode == MODE_DRA:
        return _prepare_dra(request, obj, rule, response)
    patch = _patch_for(obj, rule)
    refused = bad_job_name(obj) if patch is not None else ""
    if refused:
        response["allowed"] = False
        response["status"] = {"code": 400, "reason": "BadRequest", "message": refused}
    elif patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return response


def finish(prepared: dict[str, Any] | Pending, rule: Rule) -> dict[str, Any]:
    """The AdmissionResponse, once `prepare`'s calls to the API server are made."""
    if not isinstance(prepared, Pending):
        return prepared
    response = prepared.response
    assert rule.ensure is not None  # Rule checks it
    try:
        outcome = dra_carry_out(prepared.plan, prepared.namespace, rule.ensure,
                                dry_run=prepared.dry_run, quota=rule.quota)  # fmt: skip
    except Refused as e:
        return _refused(response, e)
    response["patchType"] = "JSONPatch"
    response["patch"] = base64.b64encode(json.dumps(outcome.patch).encode()).decode()
    response["auditAnnotations"] = {"claim-template": outcome.template}
    return response


def answer(request: Mapping[str, Any], rule: Rule) -> dict[str, Any]:
    """The AdmissionResponse for one AdmissionRequest (ReviewError: malformed)."""
    return finish(prepare(request, rule), rule)


def _refused(response: dict[str, Any], e: Refused) -> dict[str, Any]:
    response["allowed"] = False
    reason = {400: "BadRequest", 403: "Forbidden", 429: "TooManyRequests"}.get(
        e.code, "InternalError"
    )
    response["status"] = {"code": e.code, "reason": reason, "message": str(e)}
    if e.code == 429:  # the API server sends it on as Retry-After: clients retry by themselves
        response["status"]["details"] = {"retryAfterSeconds": 1}
    return response


def _prepare_dra(
    request: Mapping[str, Any], pod: Mapping[str, Any], rule: Rule, response: dict[str, Any]
) -> dict[str, Any] | Pending:
    metadata = _optional_mapping(pod, "metadata", "request.object")
    labels = _optional_mapping(metadata, "labels", "request.object.metadata")
    spec = _mapping(pod.get("spec"), "request.object.spec")
    if labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE or not asks_for_compute(spec):
        return response
    namespace = request.get("namespace") or metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ReviewError("request.namespace is missing")
    try:
        plan = dra_plan(pod, db=rule.profiles, profiles=rule.runtime_profiles)
    except Refused as e:
        return _refused(response, e)
    return Pending(response, namespace, plan, request.get("dryRun") is True)


def parse_review(body: bytes) -> Mapping[str, Any]:
    """The AdmissionRequest of an AdmissionReview body (ReviewError says what is wrong)."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReviewError(f"the body is not JSON: {e}") from e
    document = _mapping(document, "the body")
    if document.get("apiVersion") != REVIEW_VERSION or document.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"not an AdmissionReview {REVIEW_VERSION}: apiVersion "
            f"{str(document.get('apiVersion'))[:64]!r}, kind {str(document.get('kind'))[:64]!r}"
        )
    return _mapping(document.get("request"), "request")


def reviewed(response: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview carrying `response`."""
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}


def review(body: bytes, rule: Rule) -> dict[str, Any]:
    """The AdmissionReview answering `body` (ReviewError says what is wrong with it)."""
    return reviewed(answer(parse_review(body), rule))
