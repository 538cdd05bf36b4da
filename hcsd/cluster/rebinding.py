"""Image rebinding at bind: a pod naming a RuntimeProfile (`hcs.io/runtime-profile`) gets,
for each container that holds devices, the image of the profile's entry for the vendor (and
model) it was given, written before the Binding.

A container's `image` is the one field of a pod's spec that Kubernetes lets anyone change
after creation, and a Binding carries annotations only, so the images go in a patch of their
own: a strategic-merge patch (containers merged by name) naming the uid and resourceVersion
the bind read, which the API server checks as preconditions (409 on a pod written since:
bind reads it again and retries once). The Binding that follows names the version this
patch made, and carries the signed assignment with the resolved profile (version 3) as
before, so a pod is never annotated for a node it did not get. A Binding that fails after
the patch leaves an unbound pod with the image of the vendor last chosen, which the next
bind sets again for wherever the pod goes; nothing runs it meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hcsd.cluster.decisions import Decider
from hcsd.cluster.kube import Kube, paths_for
from hcsd.cluster.runtime_profiles import cover_of, resolve
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, RUNTIME_PROFILES
from hcsd.contract.runtime_binding import ResolvedRuntime
from hcsd.model import Device, Grant

__all__ = ["STRATEGIC_MERGE_PATCH", "Rebinder"]

log = logging.getLogger(__name__)

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class Rebinder:
    def __init__(self, kube: Kube, decider: Decider) -> None:
        self.kube = kube
        self.decider = decider  # its profiles (the informer's) and profile database

    def resolve(
        self, name: str, grants: Mapping[str, Sequence[Grant]], devices: Sequence[Device]
    ) -> dict[str, ResolvedRuntime] | str:
        """Each container's resolved runtime from the profile as it is now (not as it was
        when the pod was planned: a profile changed in between refuses the bind, and
        kube-scheduler tries again), or why not."""
        profile = self.decider.profiles(name)
        if profile is None:
            return (
                f"{ANNOTATION_RUNTIME_PROFILE}: RuntimeProfile {name!r} does not exist "
                f"(kubectl get {RUNTIME_PROFILES})"
            )
        return resolve(profile, cover_of(profile, self.decider.db), grants, devices)

    def set_images(self, pod: Mapping[str, Any], runtime: Mapping[str, ResolvedRuntime]) -> str:
        """Set each container's image to its runtime's (one patch; none when every image is
        right already); the pod's resourceVersion after it. KubeError as the API server
        answers (409: the pod was written since it was read)."""
        meta = pod.get("metadata") or {}
        version = str(meta.get("resourceVersion") or "")
        current = {
            str(c.get("name")): c.get("image")
            for c in (pod.get("spec") or {}).get("containers") or ()
        }
        changes = [
            {"name": name, "image": r.image}
            for name, r in sorted(runtime.items())
            if current.get(name) != r.image
        ]
        if not changes:
            return version
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        patch = {
            "metadata": {"uid": meta.get("uid"), "resourceVersion": version},
            "spec": {"containers": changes},
        }
        written = self.kube.request(
            "PATCH",
            paths_for("v1", "pods", namespace, name),
            body=patch,
            content_type=STRATEGIC_MERGE_PATCH,
        )
        log.info(
            "%s/%s: runtime profile %s: %s",
            namespace,
            name,
            next(iter(runtime.values())).profile,
            ", ".join(f"{c['name']}={c['image']}" for c in changes),
        )
        return str((written.get("metadata") or {}).get("resourceVersion") or version)
