"""Making sure a pod's ResourceClaimTemplate exists: one per claim shape and namespace.

The name is a hash of the claim spec (claim_shapes.template_name), so every webhook replica
and every pod of one shape agree on it without talking to each other. The template is read
first (the common case: a second pod of a shape, one GET); when it is missing it is created,
and a create that loses a race to another replica (409 AlreadyExists) counts as done once the
template read back holds the spec asked for. A template of that name with another spec (made
by hand: the API server never changes a template's spec) is refused rather than used: the pod
would get devices it did not ask for.

Needs `get` and `create` on resourceclaimtemplates and nothing more: templates are never
listed, changed or deleted here (docs/dra.md says why none are garbage-collected).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from hcsd.cluster.kube import KubeError
from hcsd.cluster.webhook_dra import TemplateConflict, TemplateUnavailable

__all__ = ["RESOURCE_API", "TemplateConflict", "TemplateUnavailable", "Templates"]

log = logging.getLogger("hcs.webhook")

RESOURCE_API = "/apis/resource.k8s.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "hcs-admission-webhook"}


class _Api(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


def _holds(actual: Any, wanted: Any) -> bool:
    """Whether `actual` (read back) holds every field of `wanted` (the API server adds
    defaults, never changes a value given in the form claim_shapes writes it)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_holds(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_holds(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


class Templates:
    """`ensure(namespace, name, spec)` against one API client."""

    def __init__(self, api: _Api) -> None:
        self.api = api

    def _path(self, namespace: str, name: str = "") -> str:
        base = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates"
        return f"{base}/{name}" if name else base

    def _check(
        self,
        found: Mapping[str, Any],
        namespace: str,
        name: str,
        spec: Any,
        annotations: Mapping[str, str],
    ) -> None:
        held = ((found.get("spec") or {}).get("metadata") or {}).get("annotations") or {}
        if not _holds((found.get("spec") or {}).get("spec"), spec) or dict(held) != dict(
            annotations
        ):
            raise TemplateConflict(
                f"ResourceClaimTemplate {namespace}/{name} exists with another spec than this "
                "pod's request needs (not made by hcs-admission-webhook?): delete it"
            )

    def ensure(
        self,
        namespace: str,
        name: str,
        spec: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
    ) -> bool:
        """Make sure the template exists with `spec` (the ResourceClaimSpec) and the
        `annotations` its claims are to carry (a RuntimeProfile's name); True when this call
        created it. TemplateConflict, TemplateUnavailable."""
        annotations = annotations or {}
        try:
            found = self.api.get(self._path(namespace, name))
            self._check(found, namespace, name, spec, annotations)
            return False
        except KubeError as e:
            if not e.not_found:
                raise TemplateUnavailable(f"failed to read ResourceClaimTemplate: {e}") from e
        template: dict[str, Any] = {"spec": spec}
        if annotations:  # copied to every claim made from the template
            template["metadata"] = {"annotations": dict(annotations)}
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
            "spec": template,
        }
        try:
            self.api.create(self._path(namespace), body)
        except KubeError as e:
            if not e.conflict:
                raise TemplateUnavailable(f"failed to create ResourceClaimTemplate: {e}") from e
            try:  # another replica, or another pod of the shape, made it first
                found = self.api.get(self._path(namespace, name))
            except KubeError as e2:
                raise TemplateUnavailable(f"failed to read ResourceClaimTemplate: {e2}") from e2
            self._check(found, namespace, name, spec, annotations)
            log.info("%s/%s: ResourceClaimTemplate made meanwhile by another call", namespace, name)
            return False
        log.info("%s/%s: ResourceClaimTemplate created", namespace, name)
        return True
