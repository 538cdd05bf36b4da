"""The webhook's answer in DRA mode: `ai.compute/*` become a ResourceClaimTemplate reference.

For a pod asking for `ai.compute/vram`, `ai.compute/tflops-fp16` or `ai.compute/devices`:
1. the request is read as the extender reads it (demand.demand_of) and translated
   (claim_shapes.claim_spec); what cannot be translated refuses the pod with one sentence;
2. the template for that shape is made sure of in the pod's namespace (claim_templates);
   on a dry run it is not created (the configuration says `sideEffects: NoneOnDryRun`);
3. the patch removes every `ai.compute/*` request and limit (no node advertises them in DRA
   mode: the pod would never fit), adds `spec.resourceClaims[{name: hcs-accelerator,
   resourceClaimTemplateName: <template>}]` and, to each container that asked, a
   `resources.claims` entry naming its own request of the claim (`r0`, `r1`, ...).
The pod keeps its scheduler: in DRA mode kube-scheduler's own DynamicResources plugin
allocates the claim, no extender is involved.

Init containers asking for `ai.compute/*` are refused: the extender never placed them either
(demand_of reads `containers` only), and a claim shared by an init container and the main
ones would hold its devices for the pod's whole life.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.cluster.claim_shapes import ShapeError, claim_spec, request_name, template_name
from hcsd.cluster.demand import DemandError, demand_of
from hcsd.contract.dra import POD_CLAIM_NAME
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, MANAGED_RESOURCES
from hcsd.profiles.database import ProfileDatabase, default_database

__all__ = [
    "DraOutcome",
    "Ensure",
    "Refused",
    "TemplateConflict",
    "TemplateUnavailable",
    "dra_patch",
]

PREFIX = "ai.compute/"

#: Makes sure the template `name` with the claim spec exists in `namespace` (claim_templates);
#: raises TemplateConflict or TemplateUnavailable. Here, not there: extender mode never loads
#: the Kubernetes client.
Ensure = Callable[[str, str, Mapping[str, Any]], object]


class TemplateConflict(Exception):
    """A template of the shape's name exists with another spec (permanent)."""


class TemplateUnavailable(Exception):
    """The API server did not answer or refused the read or write (temporary: retry)."""


class Refused(Exception):
    """The pod is refused: `code` 400 for the pod's own mistake, 500 when the API server could
    not be asked (a retry may pass)."""

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


def dra_patch(
    pod: Mapping[str, Any],
    namespace: str,
    ensure: Ensure,
    *,
    dry_run: bool = False,
    db: ProfileDatabase | None = None,
) -> DraOutcome:
    """The JSON patch for a pod asking for `ai.compute/*` (Refused says why not)."""
    spec = pod.get("spec") or {}
    profile = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RUNTIME_PROFILE)
    if profile is not None:
        # Nothing would rebind its image: the placeholder would run with the devices.
        raise Refused(
            f"{ANNOTATION_RUNTIME_PROFILE} is not supported in DRA mode (the image is rebound "
            "at the extender's bind, which DRA mode does not use): name the base image "
            "directly, or run this pod's nodes in extender mode (docs/runtime-profiles.md)"
        )
    claims = _check(spec)
    try:
        demand = demand_of(pod)
        if demand is None:
            raise Refused("ai.compute/* is asked for with no amount HCS knows")
        claim = claim_spec(demand, db or default_database())
    except (DemandError, ShapeError) as e:
        raise Refused(str(e)) from e
    name = template_name(claim)
    if not dry_run:
        try:
            ensure(namespace, name, claim)
        except TemplateConflict as e:
            raise Refused(str(e)) from e
        except TemplateUnavailable as e:
            raise Refused(f"{e} (a retry may pass)", 500) from e
    ops: list[dict[str, Any]] = []
    asking = [c.name for c in demand.containers]
    for index, container in enumerate(spec.get("containers") or ()):
        if container.get("name") in asking:
            request = request_name(asking.index(container["name"]))
            ops += _container_ops(index, container, request)
    entry = {"name": POD_CLAIM_NAME, "resourceClaimTemplateName": name}
    if claims:
        ops.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    return DraOutcome(ops, name)
