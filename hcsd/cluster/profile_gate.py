"""Runtime profiles in DRA mode: the scheduling gate that holds a profile pod until its image
follows the vendor HCS chose for it.

In DRA mode kube-scheduler allocates the claim, and nothing of HCS runs between its choice and
the kubelet, so the image cannot follow the device as it does at the extender's bind. Instead
the choice is made before kube-scheduler sees the pod:
1. at admission (webhook_dra), `gated_demand` narrows the pod's claim to the devices the
   profile has an image for, and `gate_op` adds the scheduling gate
   `hcs.io/runtime-profile` (hcsd.contract.dra);
2. the profile gate controller (profile_gate_controller.py) chooses the profile entry from the
   published ResourceSlices' free capacity (profile_choice.py), and in one write sets each
   opted-in container's image, narrows the pod's node affinity to the nodes with that entry's
   devices and removes the gate. Both are allowed on a gated pod: `image` is mutable, and
   node affinity may be tightened while a pod is gated (KEP-3838);
3. kube-scheduler then allocates the claim on one of those nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from hcsd.cluster.demand import Demand, DemandError
from hcsd.cluster.runtime_profiles import RuntimeProfile, cover_of, profile_named, runtime_profile
from hcsd.contract.dra import SCHEDULING_GATE_RUNTIME_PROFILE
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, API_VERSION, RUNTIME_PROFILES
from hcsd.profiles.database import ProfileDatabase

__all__ = [
    "ProfileReader",
    "ProfileUnavailable",
    "Profiles",
    "gate_op",
    "gate_ops",
    "gated",
    "gated_demand",
]

#: The RuntimeProfile of a name, None when there is none; raises ProfileUnavailable when the
#: API server cannot be asked.
Profiles = Callable[[str], RuntimeProfile | None]


class ProfileUnavailable(Exception):
    """The RuntimeProfile could not be read (temporary: a retry may pass)."""


def gated_demand(
    pod: Mapping[str, Any], demand: Demand, profiles: Profiles | None, db: ProfileDatabase
) -> Demand:
    """`demand` narrowed to the devices the pod's RuntimeProfile has an image for (its
    `cover`); `demand` itself for a pod naming none. DemandError when the profile is
    malformed, missing or cannot be read here."""
    name = profile_named(pod)
    if name is None:
        return demand
    if profiles is None:
        raise DemandError(
            f"{ANNOTATION_RUNTIME_PROFILE}: this webhook is not given the RuntimeProfiles"
        )
    profile = profiles(name)
    if profile is None:
        raise DemandError(
            f"{ANNOTATION_RUNTIME_PROFILE}: RuntimeProfile {name!r} does not exist "
            f"(kubectl get {RUNTIME_PROFILES})"
        )
    return replace(demand, cover=cover_of(profile, db))


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries the runtime-profile gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == SCHEDULING_GATE_RUNTIME_PROFILE for g in gates)


def gate_ops(pod: Mapping[str, Any], demand: Demand) -> list[dict[str, Any]]:
    """The operations gating a pod whose demand names a profile (none if it is gated)."""
    if demand.cover is None or gated(pod):
        return []
    return [gate_op(pod.get("spec") or {})]


def gate_op(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON patch operation adding the gate to a pod's spec."""
    gate = {"name": SCHEDULING_GATE_RUNTIME_PROFILE}
    if spec.get("schedulingGates"):
        return {"op": "add", "path": "/spec/schedulingGates/-", "value": gate}
    return {"op": "add", "path": "/spec/schedulingGates", "value": [gate]}


class _Getter(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...


class ProfileReader:
    """`Profiles` against the API server: one GET by name (the webhook's role may `get`
    runtimeprofiles and nothing more)."""

    def __init__(self, kube: _Getter) -> None:
        self.kube = kube

    def __call__(self, name: str) -> RuntimeProfile | None:
        # Here, not at the top: webhook_dra imports this module, and extender mode's webhook
        # never loads the Kubernetes client.
        from hcsd.cluster.kube import KubeError, paths_for

        try:
            obj = self.kube.get(paths_for(API_VERSION, RUNTIME_PROFILES, name=name))
        except KubeError as e:
            if e.not_found:
                return None
            raise ProfileUnavailable(f"failed to read RuntimeProfile {name}: {e}") from e
        try:
            return runtime_profile(obj)
        except ValueError as e:  # stored before a tighter schema: refused by name
            raise DemandError(f"{ANNOTATION_RUNTIME_PROFILE}: {e}") from e
