"""The profile gate controller: releases pods the DRA webhook gated for their RuntimeProfile
(profile_gate.py) once it has set their images for the vendor it chose.

Level-triggered: each pass reads the gated pods (from a watch of the unbound pods that keeps
the gated ones, in the extender; a list without it) and, when there are any, lists the
ResourceSlices, the allocated claims and the RuntimeProfiles; for each pod still carrying
the gate `hcs.io/runtime-profile` it chooses the profile entry (profile_choice.choose) and
writes one JSON patch that
- `test`s the uid, the gates, the affinity and the container names it read (a pod whose spec
  changed since is left to the next pass),
- sets the image of each container holding the pod's HCS claim to the entry's,
- adds to the pod's required node affinity `metadata.name In <the nodes with the entry's
  devices>` (into every existing term, as KEP-3838 allows on a gated pod),
- removes the gate.
A pod that cannot be released now (no room, its profile or template missing) keeps the gate
and is tried again on the next pass; the reason is logged once per change.

It runs in hcs-scheduler-extender's process in DRA mode (`--profile-gate`): that process
already lists ResourceClaims with the cluster credentials (`--count-claims`) and is
leader-elected, and only the leader runs the pass (two replicas would race to patch).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hcsd.cluster.claim_shapes import Selected, selected
from hcsd.cluster.demand import DemandError
from hcsd.cluster.informer import Informer
from hcsd.cluster.kube import Kube, KubeError, paths_for
from hcsd.cluster.profile_choice import Choice, choose, free_devices
from hcsd.cluster.profile_gate import gated
from hcsd.cluster.runtime_profiles import RuntimeProfile, cover_of, profile_named, runtime_profile
from hcsd.contract.dra import POD_CLAIM_NAME, SCHEDULING_GATE_RUNTIME_PROFILE
from hcsd.contract.names import API_VERSION, RUNTIME_PROFILES
from hcsd.profiles.database import ProfileDatabase

__all__ = ["ProfileGate", "release_patch"]

log = logging.getLogger(__name__)

RESOURCE_API = "resource.k8s.io/v1"
JSON_PATCH = "application/json-patch+json"
NODE_NAME_FIELD = "metadata.name"


def _requests(template: Mapping[str, Any]) -> list[list[Selected]]:
    """Per request of the template (r0, r1, ...), its alternatives best first."""
    found = []
    for request in ((template.get("spec") or {}).get("spec") or {}).get("devices", {}).get(
        "requests"
    ) or ():
        if "exactly" in request:
            found.append([selected(request["exactly"])])
        else:
            found.append([selected(sub) for sub in request.get("firstAvailable") or ()])
    return found


def _affinity_ops(spec: Mapping[str, Any], nodes: Sequence[str]) -> list[dict[str, Any]]:
    requirement: dict[str, Any] = {"key": NODE_NAME_FIELD, "operator": "In", "values": list(nodes)}
    term = {"matchFields": [requirement]}
    affinity = spec.get("affinity")
    if not affinity:
        required = {"nodeSelectorTerms": [term]}
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": required}}}]  # fmt: skip
    node = affinity.get("nodeAffinity")
    if not node:
        value = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": value}]
    where = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    terms = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    if not terms:
        return [{"op": "add", "path": where, "value": {"nodeSelectorTerms": [term]}}]
    ops: list[dict[str, Any]] = []
    for i, existing in enumerate(terms):
        if existing.get("matchFields"):
            ops.append({"op": "add", "path": f"{where}/nodeSelectorTerms/{i}/matchFields/-",
                        "value": requirement})  # fmt: skip
        else:
            ops.append({"op": "add", "path": f"{where}/nodeSelectorTerms/{i}/matchFields",
                        "value": [requirement]})  # fmt: skip
    return ops


def release_patch(
    pod: Mapping[str, Any], profile: RuntimeProfile, choice: Choice
) -> list[dict[str, Any]]:
    """The JSON patch releasing `pod` with the images of `choice`'s entry."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    image = profile.entries[choice.entry].runtime.image
    # Preconditions on what the operations below are computed from (not the resourceVersion:
    # kube-scheduler and the resource-claim controller write the status of a new pod as it
    # is read, and those writes change nothing this patch depends on).
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": meta.get("uid")},
        {"op": "test", "path": "/spec/schedulingGates", "value": spec.get("schedulingGates")},
    ]
    if spec.get("affinity"):
        ops.append({"op": "test", "path": "/spec/affinity", "value": spec["affinity"]})
    for i, container in enumerate(spec.get("containers") or ()):
        ops.append({"op": "test", "path": f"/spec/containers/{i}/name", "value": container["name"]})
    for i, container in enumerate(spec.get("containers") or ()):
        claims = (container.get("resources") or {}).get("claims") or ()
        if any(c.get("name") == POD_CLAIM_NAME for c in claims) and container.get("image") != image:
            ops.append({"op": "replace", "path": f"/spec/containers/{i}/image", "value": image})
    ops += _affinity_ops(spec, choice.nodes)
    gates = spec.get("schedulingGates") or []
    for i in reversed(range(len(gates))):
        if gates[i].get("name") == SCHEDULING_GATE_RUNTIME_PROFILE:
            ops.append({"op": "remove", "path": f"/spec/schedulingGates/{i}"})
    return ops


def _template_name(pod: Mapping[str, Any]) -> str | None:
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("name") == POD_CLAIM_NAME:
            name = entry.get("resourceClaimTemplateName")
            return str(name) if name else None
    return None


UNBOUND = ("fieldSelector", "spec.nodeName=")


def _gated_pod(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the watch keeps of an unbound pod: the pod while it carries the gate."""
    return dict(obj) if gated(obj) else None


class ProfileGate:
    """`watch`: follow the unbound pods with a watch (kept: the gated ones only) rather than
    listing every unbound pod of the cluster at each pass; `run` starts and stops it."""

    def __init__(self, kube: Kube, db: ProfileDatabase, *, watch: bool = False) -> None:
        self.kube = kube
        self.db = db
        self.waiting: dict[str, str] = {}  # pod uid -> the reason last logged
        self.pods: Informer[dict[str, Any]] | None = None
        if watch:
            self.pods = Informer(kube, paths_for("v1", "pods"), _gated_pod, query=[UNBOUND],
                                 name="gated pods")  # fmt: skip

    def _pending(self) -> list[dict[str, Any]]:
        """The pods carrying the gate: from the watch once it has listed, else a list."""
        if self.pods is None:
            pods, _ = self.kube.list_all(paths_for("v1", "pods"), [UNBOUND])
            return [p for p in pods if gated(p)]
        if not self.pods.synced.is_set():
            return []
        with self.pods.lock:
            return list(self.pods.items.values())

    def _hold(self, label: str, uid: str, why: str) -> None:
        if self.waiting.get(uid) != why:
            log.info("%s: kept gated (%s): %s", label, SCHEDULING_GATE_RUNTIME_PROFILE, why)
            self.waiting[uid] = why

    def run(self, stopping: threading.Event, every: float, is_leader: Callable[[], bool]) -> None:
        """A pass every `every` seconds while this replica leads, until `stopping` is set."""
        if self.pods is not None:
            self.pods.start()
        try:
            while not stopping.wait(every):
                if not is_leader():
                    continue
                try:
                    self.pass_once()
                except KubeError as e:
                    log.warning("failed to list what the profile gate reads: %s", e)
                except Exception:  # a bug or an object it cannot read: the next pass again
                    log.exception("the profile gate's pass failed")
        finally:
            if self.pods is not None:
                self.pods.stop()

    def pass_once(self) -> int:
        """One pass over every gated pod; how many were released."""
        pending = self._pending()
        self.waiting = {k: v for k, v in self.waiting.items() if k in {
            str((p.get("metadata") or {}).get("uid")) for p in pending}}  # fmt: skip
        if not pending:
            return 0
        slices, _ = self.kube.list_all(paths_for(RESOURCE_API, "resourceslices"))
        claims, _ = self.kube.list_all(paths_for(RESOURCE_API, "resourceclaims"))
        raw, _ = self.kube.list_all(paths_for(API_VERSION, RUNTIME_PROFILES))
        profiles = {}
        for obj in raw:
            try:
                profile = runtime_profile(obj)
            except ValueError as e:
                log.warning("skipping a RuntimeProfile: %s", e)
                continue
            profiles[profile.name] = profile
        devices = free_devices(slices, claims)
        released = 0
        for pod in pending:
            try:
                released += self._release(pod, profiles, devices)
            except Exception:  # one pod the gate cannot read holds up no other
                meta = pod.get("metadata") or {}
                log.exception("%s/%s: the profile gate failed", meta.get("namespace"),
                              meta.get("name"))  # fmt: skip
        return released

    def _decide(
        self, pod: Mapping[str, Any], profiles: Mapping[str, RuntimeProfile], devices: list[Any]
    ) -> tuple[RuntimeProfile, Choice] | str:
        """The profile and the entry the pod runs with, or why it stays gated."""
        try:
            profile_name = profile_named(pod)
        except DemandError as e:
            return str(e)
        if profile_name is None:  # a gate of this name on a pod that names no profile
            return "it names no RuntimeProfile"
        profile = profiles.get(profile_name)
        if profile is None:
            return f"RuntimeProfile {profile_name} does not exist"
        template = _template_name(pod)
        if template is None:
            return f"it has no {POD_CLAIM_NAME} claim template"
        namespace = str((pod.get("metadata") or {}).get("namespace"))
        try:
            found = self.kube.get(
                paths_for(RESOURCE_API, "resourceclaimtemplates", namespace, template)
            )
            requests = _requests(found)
        except (KubeError, ValueError) as e:
            return f"failed to read ResourceClaimTemplate {template}: {e}"
        choice = choose(requests, cover_of(profile, self.db), devices)
        return choice if isinstance(choice, str) else (profile, choice)

    def _release(
        self, pod: Mapping[str, Any], profiles: Mapping[str, RuntimeProfile], devices: list[Any]
    ) -> int:
        meta = pod.get("metadata") or {}
        namespace, name, uid = (
            str(meta.get("namespace")),
            str(meta.get("name")),
            str(meta.get("uid")),
        )
        label = f"{namespace}/{name}"
        decided = self._decide(pod, profiles, devices)
        if isinstance(decided, str):
            self._hold(label, uid, decided)
            return 0
        profile, choice = decided
        patch = release_patch(pod, profile, choice)
        try:
            self.kube.request(
                "PATCH", paths_for("v1", "pods", namespace, name), body=patch,
                content_type=JSON_PATCH,
            )  # fmt: skip
        except KubeError as e:  # written since (the test failed), or gone: the next pass
            log.warning("%s: failed to release the pod: %s", label, e)
            return 0
        entry = profile.entries[choice.entry]
        log.info(
            "%s: runtime profile %s: %s %s, image %s, nodes %s; gate removed",
            label, profile.name, entry.vendor.value, ",".join(entry.models) or "(any model)",
            entry.runtime.image, ",".join(choice.nodes[:8]),
        )  # fmt: skip
        self.waiting.pop(uid, None)
        return 1
