"""The signed `hcs.io/assignment` pod annotation: what the scheduler decided for a pod.

The scheduler extender builds and signs it at bind; hcsd verifies it before it holds anything
for the pod's containers; the extender's informer parses it back (unverified) to know what
bound pods hold. JSON, signed with HMAC-SHA256 over its canonical form (sorted keys, no spaces)
without `sig`:
  {"v": 1, "node": "node-1", "pod_uid": "…", "issued": 1763800000,
   "containers": {"main": [{"uuid": "GPU-…", "vram": 17179869184, "compute": 0}]},
   "sig": "<64 lower-case hex digits>"}
The signature binds the pod uid and the node, so an annotation copied to another pod or node
does not verify there; `issued` bounds how long an unused assignment stays valid. Whatever the
text holds, every failure is an `AssignmentError` whose message says what is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hcsd.contract.names import ANNOTATION_ASSIGNMENT
from hcsd.model import Grant

__all__ = [
    "ANNOTATION",
    "Assignment",
    "AssignmentError",
    "build",
    "encode",
    "parse",
    "sign",
    "verify",
]

ANNOTATION = ANNOTATION_ASSIGNMENT
VERSION = 1
MAX_BYTES = 64 * 1024
CLOCK_SKEW = 300.0
_SIGNATURE = re.compile(r"[0-9a-f]{64}")


class AssignmentError(ValueError):
    """The annotation is missing a field, malformed, forged, stale or for someone else."""


@dataclass(frozen=True, slots=True)
class Assignment:
    node: str
    pod_uid: str
    issued: float
    containers: Mapping[str, tuple[Grant, ...]]


def build(
    node: str, pod_uid: str, issued: float, containers: Mapping[str, Sequence[Grant]]
) -> dict[str, Any]:
    """The unsigned body for a pod's grants per container (`issued`: unix seconds)."""
    return {
        "v": VERSION,
        "node": node,
        "pod_uid": pod_uid,
        "issued": int(issued),
        "containers": {
            name: [
                {"uuid": g.device_uuid, "vram": g.vram_bytes, "compute": g.compute_percent}
                for g in grants
            ]
            for name, grants in containers.items()
        },
    }


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _signature(body: Mapping[str, Any], key: bytes) -> str:
    unsigned = {k: v for k, v in body.items() if k != "sig"}
    return hmac.new(key, _canonical(unsigned), hashlib.sha256).hexdigest()


def sign(body: Mapping[str, Any], key: bytes) -> str:
    """The annotation value for `body`: the body with its `sig` (any old one replaced)."""
    unsigned = {k: v for k, v in body.items() if k != "sig"}
    return json.dumps(
        {**unsigned, "sig": _signature(unsigned, key)}, sort_keys=True, separators=(",", ":")
    )


def encode(assignment: Assignment, key: bytes) -> str:
    """The signed annotation value for an assignment."""
    body = build(assignment.node, assignment.pod_uid, assignment.issued, assignment.containers)
    return sign(body, key)


def _load(text: str) -> dict[str, Any]:
    if len(text) > MAX_BYTES:
        raise AssignmentError(f"{ANNOTATION} is larger than {MAX_BYTES} bytes")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than Python's
        raise AssignmentError(f"{ANNOTATION} is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise AssignmentError(f"{ANNOTATION} is not a JSON object")
    return body


def _field(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    # bool is an int to Python, never to this format.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AssignmentError(f"{ANNOTATION} is malformed: {name!r} must be a {kind.__name__}")
    return value


def _grant(raw: Any) -> Grant:
    if not isinstance(raw, dict):
        raise AssignmentError(f"{ANNOTATION} is malformed: a grant must be an object")
    uuid = _field(raw, "uuid", str)
    vram = _field(raw, "vram", int)
    compute = _field(raw, "compute", int) if "compute" in raw else 0
    if not uuid or vram < 0 or not 0 <= compute <= 100:
        raise AssignmentError(f"{ANNOTATION} is malformed: grant {raw!r} is out of range")
    return Grant(uuid, vram, compute)


def _assignment(body: Mapping[str, Any]) -> Assignment:
    version = body.get("v")
    if version != VERSION or isinstance(version, bool):
        raise AssignmentError(f"{ANNOTATION} version {version!r} is not supported")
    issued = body.get("issued")
    if not isinstance(issued, int | float) or isinstance(issued, bool) or not math.isfinite(issued):
        raise AssignmentError(f"{ANNOTATION} is malformed: 'issued' must be a finite number")
    containers = _field(body, "containers", dict)
    grants = {}
    for name, raw in containers.items():
        if not isinstance(raw, list):
            raise AssignmentError(f"{ANNOTATION} is malformed: container {name!r} needs a list")
        grants[name] = tuple(_grant(g) for g in raw)
    return Assignment(_field(body, "node", str), _field(body, "pod_uid", str), issued, grants)


def parse(text: str) -> Assignment:
    """The assignment as written, signature NOT checked: for the scheduler's own bookkeeping
    of what bound pods hold, never to hand out devices (that is `verify`)."""
    return _assignment(_load(text))


def verify(
    text: str, key: bytes, *, node: str, pod_uid: str, now: float, max_age: float
) -> Assignment:
    """The assignment, if `key` signed it for this node and pod within `max_age` seconds."""
    body = _load(text)
    signature = body.get("sig")
    if not isinstance(signature, str):
        raise AssignmentError(f"{ANNOTATION} has no signature")
    if not _SIGNATURE.fullmatch(signature):
        raise AssignmentError(
            f"{ANNOTATION} signature is not 64 lower-case hex digits (forged or damaged)"
        )
    if not key:
        raise AssignmentError("no assignment key is configured on this node; cannot verify")
    if not hmac.compare_digest(_signature(body, key).encode(), signature.encode()):
        raise AssignmentError(f"{ANNOTATION} signature does not verify (forged or wrong key)")
    assignment = _assignment(body)
    if assignment.node != node:
        raise AssignmentError(f"{ANNOTATION} is for node {assignment.node}, this is {node}")
    if assignment.pod_uid != pod_uid:
        raise AssignmentError(f"{ANNOTATION} is for pod uid {assignment.pod_uid}, not {pod_uid}")
    issued = assignment.issued
    if issued > now + CLOCK_SKEW:
        raise AssignmentError(f"{ANNOTATION} was issued in the future ({issued - now:.0f}s)")
    if now - issued > max_age:
        raise AssignmentError(
            f"{ANNOTATION} is stale: issued {now - issued:.0f}s ago (limit {max_age:.0f}s)"
        )
    return assignment
