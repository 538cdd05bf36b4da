"""From a ResourceClaim (resource.k8s.io/v1) to hcsd's PrepareClaim request.

kubelet passes only a claim's namespace, name and uid: the plugin reads the claim from the API
server (never trusting more than the identity it was given), checks that the uid is the one
kubelet means (a claim deleted and made again under the same name is another claim: its uid
differs, and the old one must not be prepared with the new one's devices), and takes the
allocation's results for this driver. Each result names its device (`nvidia-0`), its pool,
for a device with `allowMultipleAllocations` the share id, and the capacity consumed
(`memory` in bytes, `compute` in percent); a result without consumedCapacity is the whole
device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract import dra

__all__ = ["ClaimError", "base_request", "claim_path", "prepare_request", "read_claim"]

RESOURCE_API = "resource.k8s.io/v1"


class ClaimError(Exception):
    """The claim cannot be prepared now; the text goes back to kubelet, which retries."""


def claim_path(namespace: str, name: str) -> str:
    return f"/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


def read_claim(kube: Kube, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The claim kubelet means, allocated; ClaimError otherwise."""
    try:
        claim = kube.get(claim_path(namespace, name))
    except KubeError as e:
        raise ClaimError(f"failed to read ResourceClaim {namespace}/{name}: {e}") from e
    found = claim.get("metadata", {}).get("uid", "")
    if found != uid:
        raise ClaimError(
            f"ResourceClaim {namespace}/{name} is now uid {found}, not {uid}: it was replaced"
        )
    if not claim.get("status", {}).get("allocation"):
        raise ClaimError(f"ResourceClaim {namespace}/{name} is not allocated")
    return claim


def base_request(name: str) -> str:
    """`gpu/a100` (a subrequest of a firstAvailable list) -> `gpu`: kubelet matches a
    container's claim reference against the request's own name."""
    return name.split("/", 1)[0]


def prepare_request(claim: Mapping[str, Any]) -> pb.PrepareClaimRequest:
    """hcsd's request for this driver's results of an allocated claim."""
    meta = claim["metadata"]
    results = claim["status"]["allocation"].get("devices", {}).get("results") or []
    devices = []
    for result in results:
        if result.get("driver") != dra.DRIVER:
            continue
        consumed = result.get("consumedCapacity") or {}
        devices.append(
            pb.ClaimDevice(
                request=str(result.get("request", "")),
                device=str(result.get("device", "")),
                pool=str(result.get("pool", "")),
                share_id=str(result.get("shareID") or ""),
                memory=str(consumed.get(dra.CAPACITY_MEMORY, "")),
                compute=str(consumed.get(dra.CAPACITY_COMPUTE, "")),
            )
        )
    if not devices:
        raise ClaimError(
            f"ResourceClaim {meta['namespace']}/{meta['name']} has no device of {dra.DRIVER}"
        )
    return pb.PrepareClaimRequest(
        claim=pb.PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        devices=devices,
    )
