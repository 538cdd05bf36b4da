"""The signed `hcs.io/assignment` pod annotation: what the scheduler decided for a pod.

JSON, signed with HMAC-SHA256 over its canonical form (sorted keys, no spaces) without `sig`:
  {"v": 1, "node": "node-1", "pod_uid": "…", "issued": 1763800000,
   "containers": {"main": [{"uuid": "GPU-…", "vram": 17179869184, "compute": 0}]},
   "sig": "<hex>"}
The signature binds the pod uid and the node, so an annotation copied to another pod or node
does not verify there; `issued` bounds how long an unused assignment stays valid.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from hcsd.model import Grant

__all__ = ["ANNOTATION", "Assignment", "AssignmentError", "sign", "verify"]

ANNOTATION = "hcs.io/assignment"
MAX_BYTES = 64 * 1024
CLOCK_SKEW = 300.0


class AssignmentError(Exception):
    """The annotation is missing a field, malformed, forged, stale or for someone else."""


@dataclass(frozen=True, slots=True)
class Assignment:
    node: str
    pod_uid: str
    issued: float
    containers: dict[str, tuple[Grant, ...]]


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(body: dict[str, Any], key: bytes) -> str:
    """The annotation value for `body` (used by the scheduler extender and by tests)."""
    unsigned = {k: v for k, v in body.items() if k != "sig"}
    signature = hmac.new(key, _canonical(unsigned), hashlib.sha256).hexdigest()
    return json.dumps({**unsigned, "sig": signature}, sort_keys=True, separators=(",", ":"))


def verify(
    text: str, key: bytes, *, node: str, pod_uid: str, now: float, max_age: float
) -> Assignment:
    if len(text) > MAX_BYTES:
        raise AssignmentError(f"{ANNOTATION} is larger than {MAX_BYTES} bytes")
    try:
        body = json.loads(text)
    except ValueError as e:
        raise AssignmentError(f"{ANNOTATION} is not JSON: {e}") from e
    if not isinstance(body, dict) or not isinstance(body.get("sig"), str):
        raise AssignmentError(f"{ANNOTATION} has no signature")
    if not key:
        raise AssignmentError("no assignment key is configured on this node; cannot verify")
    expected = hmac.new(
        key, _canonical({k: v for k, v in body.items() if k != "sig"}), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, body["sig"]):
        raise AssignmentError(f"{ANNOTATION} signature does not verify (forged or wrong key)")
    try:
        if body["v"] != 1:
            raise AssignmentError(f"{ANNOTATION} version {body['v']} is not supported")
        issued = float(body["issued"])
        containers = {
            str(name): tuple(
                Grant(str(g["uuid"]), int(g["vram"]), int(g.get("compute", 0))) for g in grants
            )
            for name, grants in body["containers"].items()
        }
        assignment = Assignment(str(body["node"]), str(body["pod_uid"]), issued, containers)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AssignmentError(f"{ANNOTATION} is malformed: {e!r}") from e
    if assignment.node != node:
        raise AssignmentError(f"{ANNOTATION} is for node {assignment.node}, this is {node}")
    if assignment.pod_uid != pod_uid:
        raise AssignmentError(f"{ANNOTATION} is for pod uid {assignment.pod_uid}, not {pod_uid}")
    if issued > now + CLOCK_SKEW:
        raise AssignmentError(f"{ANNOTATION} was issued in the future ({issued - now:.0f}s)")
    if now - issued > max_age:
        raise AssignmentError(
            f"{ANNOTATION} is stale: issued {now - issued:.0f}s ago (limit {max_age:.0f}s)"
        )
    return assignment
