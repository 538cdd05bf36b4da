"""The webhook's answer in DRA mode: `ai.compute/*` become a ResourceClaimTemplate reference.

For a pod asking for `ai.compute/vram`, `ai.compute/tflops-fp16` or `ai.compute/devices`:
1. the request is read as the extender reads it (demand.demand_of) and translated
   (claim_shapes.claim_spec); what cannot be translated refuses the pod with one sentence;
2. with a Gate (claim_quota), a pod that would go over its namespace's ComputeQuota is
   refused, and its charge is written on it; then the template for that shape is made sure
   of in the pod's namespace (claim_templates);
   on a dry run it is not created (the configuration says `sideEffects: NoneOnDryRun`);
3. the patch removes every `ai.compute/*` request and limit (no node advertises them in DRA
   mode: the pod would never fit), adds `spec.resourceClaims[{name: hcs-accelerator,
   resourceClaimTemplateName: <template>}]` and, to each container that asked, a
   `resources.claims` entry naming its own request of the claim (`r0`, `r1`, ...).
A pod naming a RuntimeProfile (`hcs.io/runtime-profile`) gets a claim narrowed to the devices
the profile has an image for and the scheduling gate `hcs.io/runtime-profile`, which the
profile gate controller removes once it has set the images (profile_gate.py).
The pod keeps its scheduler: in DRA mode kube-scheduler's own DynamicResources plugin
allocates the claim, no extender is involved.

Init containers asking for `ai.compute/*` are refused: the extender never placed them either
(demand_of reads `containers` only), and a claim shared by an init container and the main
ones would hold its devices for the pod's whole life.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hcsd.cluster.claim_shapes import ShapeError, claim_spec, request_name, template_name
from hcsd.cluster.demand import DemandError, demand_of
from hcsd.cluster.profile_gate import (
    Profiles,
    ProfileUnavailable,
    gate_ops,
    gated_demand,
)
from hcsd.contract.dra import ANNOTATION_QUOTA_CHARGE, POD_CLAIM_NAME
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, MANAGED_RESOURCES
from hcsd.profiles.database import ProfileDatabase, default_database

__all__ = [
    "DraOutcome",
    "DraPlan",
    "Ensure",
    "Gate",
    "Refused",
    "TemplateConflict",
    "TemplateUnavailable",
    "dra_carry_out",
    "dra_patch",
    "dra_plan",
]

PREFIX = "ai.compute/"


class Ensure(Protocol):
    """Makes sure the template `name` with the claim spec (and the annotations its claims are
    to carry) exists in `namespace` (claim_templates); raises TemplateConflict or
    TemplateUnavailable. Here, not there: extender mode never loads the Kubernetes client."""

    def __call__(
        self,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> object: ...


class Gate(Protocol):
    """The namespace's ComputeQuota at admission (claim_quota.QuotaGate): `admit` gives the
    charge to write on the pod or raises Refused; `release` forgets
    a charge whose pod is refused after all."""

    def admit(self, namespace: str, claim: Mapping[str, Any], dry_run: bool) -> str: ...

    def release(self, annotation: str) -> None: ...


class TemplateConflict(Exception):
    """A template of the shape's name exists with another spec (permanent)."""


class TemplateUnavailable(Exception):
    """The API server did not answer or refused the read or write (temporary: retry)."""


class Refused(Exception):
    """The pod is refused: `code` 400 for the pod's own mistake, 403 over a ComputeQuota,
    500 when the API server could not be asked (a retry may pass)."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class DraOutcome:
    patch: list[dict[str, Any]]
    template: str


def _escape(name: str) -> str:
    """A JSON pointer token (RFC 6901): `ai.compute/vram` is `ai.compute~1vram`."""
    return name.replace("~", "~0").replace("/", "~1")


def _asked(container: Mapping[str, Any]) -> set[str]:
    """The `ai.compute/*` names in the container's requests and limits."""
    resources = container.get("resources") or {}
    return {
        str(name)
        for field in ("requests", "limits")
        for name in (resources.get(field) or {})
        if str(name).startswith(PREFIX)
    }


def _container_ops(index: int, container: Mapping[str, Any], request: str) -> list[dict[str, Any]]:
    where = f"/spec/containers/{index}/resources"
    resources = container.get("resources") or {}
    ops: list[dict[str, Any]] = []
    for field in ("requests", "limits"):
        for name in resources.get(field) or {}:
            if str(name).startswith(PREFIX):
                ops.append({"op": "remove", "path": f"{where}/{field}/{_escape(str(name))}"})
    claim = {"name": POD_CLAIM_NAME, "request": request}
    if resources.get("claims"):
        ops.append({"op": "add", "path": f"{where}/claims/-", "value": claim})
    else:
        ops.append({"op": "add", "path": f"{where}/claims", "value": [claim]})
    return ops


def _annotation_op(annotations: bool, charge: str) -> dict[str, Any]:
    """Set the quota charge (any value the pod came with is replaced); `annotations`: whether
    the pod has any."""
    if not annotations:
        return {"op": "add", "path": "/metadata/annotations",
                "value": {ANNOTATION_QUOTA_CHARGE: charge}}  # fmt: skip
    where = f"/metadata/annotations/{_escape(ANNOTATION_QUOTA_CHARGE)}"
    return {"op": "add", "path": where, "value": charge}


def _check(spec: Mapping[str, Any]) -> list[Any]:
    """Refuse what DRA mode cannot take, before any translation; the pod's resourceClaims."""
    for container in spec.get("containers") or ():
        unknown = sorted(_asked(container) - set(MANAGED_RESOURCES))
        if unknown:
            raise Refused(
                f"container {str(container.get('name'))[:63]}: {unknown[0][:80]} is not a "
                f"resource HCS knows: ask for {', '.join(MANAGED_RESOURCES)}"
            )
    if any(_asked(c) for c in spec.get("initContainers") or ()):
        raise Refused(
            "ai.compute/* in an init container is not supported in DRA mode: ask for it in "
            "the containers that use the accelerator"
        )
    claims = spec.get("resourceClaims") or []
    if any(isinstance(c, dict) and c.get("name") == POD_CLAIM_NAME for c in claims):
        raise Refused(
            f"spec.resourceClaims already has an entry named {POD_CLAIM_NAME}, the name HCS "
            "gives the claim for ai.compute/*: rename it"
        )
    return list(claims)


def _ensure(
    ensure: Ensure,
    where: tuple[str, str],
    claim: dict[str, Any],
    notes: dict[str, str],
    *,
    quota: Gate | None,
    charge: str | None,
) -> None:
    """Make the template; whatever stops it, the pod is not created, so its charge is
    released before the refusal (or the unexpected error) goes up."""
    try:
        ensure(*where, claim, *([notes] if notes else []))  # 3 args: as before
    except BaseException as e:
        if quota is not None and charge is not None:
            quota.release(charge)
        if isinstance(e, TemplateConflict):
            raise Refused(str(e)) from e
        if isinstance(e, TemplateUnavailable):
            raise Refused(f"{e} (a retry may pass)", 500) from e
        raise


@dataclass(frozen=True, slots=True)
class DraPlan:
    """What the webhook will answer for a pod, read from the pod alone: the claim, its
    template's name and the patch but for the charge. Small whatever the pod's size, so the
    pod's parsed body can go before the calls to the API server start (webhook_server)."""

    claim: dict[str, Any]
    notes: dict[str, str]
    template: str
    ops: list[dict[str, Any]]  # without the charge's annotation
    annotations: bool  # whether the pod has metadata.annotations (the charge's op differs)


def dra_plan(
    pod: Mapping[str, Any],
    *,
    db: ProfileDatabase | None = None,
    profiles: Profiles | None = None,
) -> DraPlan:
    """The plan for a pod asking for `ai.compute/*` (Refused says why not)."""
    spec = pod.get("spec") or {}
    claims = _check(spec)
    try:
        demand = demand_of(pod)
        if demand is None:
            raise Refused("ai.compute/* is asked for with no amount HCS knows")
        demand = gated_demand(pod, demand, profiles, db or default_database())
        claim = claim_spec(demand, db or default_database())
    except (DemandError, ShapeError) as e:
        raise Refused(str(e)) from e
    except ProfileUnavailable as e:
        raise Refused(f"{e} (a retry may pass)", 500) from e
    # A profile pod's claim carries the profile's name for the kubelet plugin (which reads
    # the entry from the RuntimeProfile itself): one template per shape and profile.
    notes = {} if demand.cover is None else {ANNOTATION_RUNTIME_PROFILE: demand.cover.profile}
    name = template_name({**claim, **notes})
    ops: list[dict[str, Any]] = []
    asking = [c.name for c in demand.containers]
    for index, container in enumerate(spec.get("containers") or ()):
        if container.get("name") in asking:
            request = request_name(asking.index(container["name"]))
            ops += _container_ops(index, container, request)
    ops += gate_ops(pod, demand)
    entry = {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": name}
    if claims:
        ops.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    annotations = ((pod.get("metadata") or {}).get("annotations")) is not None
    return DraPlan(claim, notes, name, ops, annotations)


def dra_carry_out(
    plan: DraPlan,
    namespace: str,
    ensure: Ensure,
    *,
    dry_run: bool = False,
    quota: Gate | None = None,
) -> DraOutcome:
    """The plan's calls to the API server: the quota's decision, then the template (not on a
    dry run); the patch with the charge (Refused says why not)."""
    charge = quota.admit(namespace, plan.claim, dry_run) if quota is not None else None
    if not dry_run:
        _ensure(ensure, (namespace, plan.template), plan.claim, plan.notes,
                quota=quota, charge=charge)  # fmt: skip
    ops = list(plan.ops)
    if charge is not None:
        ops.insert(0, _annotation_op(plan.annotations, charge))
    return DraOutcome(ops, plan.template)


def dra_patch(
    pod: Mapping[str, Any],
    namespace: str,
    ensure: Ensure,
    *,
    dry_run: bool = False,
    db: ProfileDatabase | None = None,
    quota: Gate | None = None,
    profiles: Profiles | None = None,
) -> DraOutcome:
    """The JSON patch for a pod asking for `ai.compute/*` (Refused says why not)."""
    plan = dra_plan(pod, db=db, profiles=profiles)
    return dra_carry_out(plan, namespace, ensure, dry_run=dry_run, quota=quota)
