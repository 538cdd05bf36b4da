"""DRA mode's runtime profiles, node side: the RuntimeProfile entry a claim's containers run
with, resolved by the kubelet plugin and sent with PrepareClaim (hcsd/runtime/claim_runtime.py
records and applies it).

The claim names its profile in the annotation `hcs.io/runtime-profile`, which the DRA
webhook puts on the claim template it makes for a profile pod and the resource-claim
controller copies to the claim. Only the name comes from there (any tenant may name any
profile, as with the pod's own annotation); the values come from the RuntimeProfile itself,
cluster-scoped and written by admins only, read here with the syncer's credentials, and the
devices' vendor and model from hcsd (the devices this node has), never from the pod or the
claim. The entry is the profile's first that admits every device the claim holds here (the
rule of the extender's bind: hcsd.cluster.runtime_profiles.resolve).

The pod the entry is for is the one reserving the claim (`status.reservedFor`, a pod: a
template's claim has exactly one): hcsd applies the profile to that pod's containers using
the claim and to no other pod's. The pod itself is not read: the syncer may read no pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.demand import Cover
from hcsd.cluster.kube import KubeError, paths_for
from hcsd.cluster.kubeletplugin.claims import ClaimError
from hcsd.cluster.runtime_profiles import cover_of, runtime_profile
from hcsd.contract import dra
from hcsd.contract.names import ANNOTATION_RUNTIME_PROFILE, API_VERSION, RUNTIME_PROFILES
from hcsd.contract.runtime_binding import PROFILE_NAME, dump
from hcsd.profiles.database import ProfileDatabase

__all__ = ["add_runtime"]


class _Getter(Protocol):
    def get(self, path: str) -> dict[str, Any]: ...


def _pod_uid(claim: Mapping[str, Any]) -> str:
    for ref in (claim.get("status") or {}).get("reservedFor") or ():
        if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("uid"):
            return str(ref["uid"])
    raise ClaimError("it names a runtime profile and is reserved for no pod")


def add_runtime(
    request: pb.PrepareClaimRequest,
    claim: Mapping[str, Any],
    kube: _Getter,
    devices: Sequence[pb.Device],
    db: ProfileDatabase,
) -> None:
    """Set `request.runtime` and `pod_uid` when the claim names a RuntimeProfile; ClaimError
    (kubelet retries, the pod's Event says why) when it cannot be resolved."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    name = annotations.get(ANNOTATION_RUNTIME_PROFILE)
    if name is None:
        return
    if not isinstance(name, str) or not PROFILE_NAME.fullmatch(name) or len(name) > 253:
        raise ClaimError(f"{ANNOTATION_RUNTIME_PROFILE}: {str(name)[:80]!r} is not a name")
    try:
        profile = runtime_profile(kube.get(paths_for(API_VERSION, RUNTIME_PROFILES, name=name)))
    except KubeError as e:
        raise ClaimError(f"failed to read RuntimeProfile {name}: {e}") from e
    except ValueError as e:
        raise ClaimError(str(e)) from e
    by_name = {f"{d.vendor}-{d.index}": d for d in devices}
    held = [by_name.get(d.device) for d in request.devices]
    missing = [d.device for d, found in zip(request.devices, held, strict=True) if found is None]
    if missing:
        raise ClaimError(f"devices {', '.join(missing)} are not on this node")
    cover = cover_of(profile, db)
    for index in range(len(profile.entries)):
        if all(d is not None and _admits(cover, index, d) for d in held):
            request.runtime = json.dumps(dump(profile.entries[index].runtime), sort_keys=True)
            request.pod_uid = _pod_uid(claim)
            return
    kinds = sorted({f"{d.vendor} {d.model}" for d in held if d is not None})
    raise ClaimError(
        f"runtime profile {name} has no image for {', '.join(kinds)} (it has: "
        f"{cover.describe()}); the claim was allocated {dra.DRIVER} devices it does not cover"
    )


def _admits(cover: Cover, index: int, device: pb.Device) -> bool:
    vendor, models = cover.entries[index]
    return bool(vendor == device.vendor and (not models or device.model.lower() in models))
