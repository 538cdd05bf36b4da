"""The signed `hcs.io/assignment` pod annotation: what the scheduler decided for a pod.

The scheduler extender builds and signs it at bind; hcsd verifies it before it holds anything
for the pod's containers; the extender's informer parses it back (unverified) to know what
bound pods hold. JSON, signed with HMAC-SHA256 over its canonical form (sorted keys, no spaces)
without `sig`:
  {"v": 2, "kid": "k2", "node": "node-1", "pod_uid": "…", "issued": 1763800000,
   "containers": {"main": [{"uuid": "GPU-…", "vram": 17179869184, "compute": 0}]},
   "sig": "<64 lower-case hex digits>"}
Version 3 is version 2 with a "runtime" object: per container, the RuntimeProfile the extender
resolved at bind (hcsd.contract.runtime_binding); it is written only for pods that use a
profile, so a node of an older release refuses exactly those pods ("version 3 is not
supported") instead of running the rebound image without the profile's env and command.
`kid` names the key that signed it (hcsd.contract.keyring: a node holds several during a
rotation, each node its own derived ones). Version 1 is the same without `kid`, signed with
the one cluster key of older releases; it is still read, and verified with the key held under
the empty id: on the extender that cluster key as it is, on a node the single key file of
those releases only until the node holds its own keys (hcsd.contract.keyring).
The signature binds the pod uid and the node, so an annotation copied to another pod or node
does not verify there; `issued` bounds how long it is accepted for a pod's first container.
Whatever the text holds, every failure is an `AssignmentError` whose message says what is
wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hcsd.contract import runtime_binding
from hcsd.contract.names import ANNOTATION_ASSIGNMENT
from hcsd.contract.runtime_binding import ResolvedRuntime, RuntimeBindingError
from hcsd.model import Grant

__all__ = [
    "ANNOTATION",
    "KID",
    "Assignment",
    "AssignmentError",
    "build",
    "check_bound",
    "digest",
    "encode",
    "parse",
    "sign",
    "verify",
]

ANNOTATION = ANNOTATION_ASSIGNMENT
VERSION = 2
RUNTIME_VERSION = 3  # version 2 with "runtime": only when a container has a resolved profile
LEGACY_VERSION = 1  # no key id: verified with the key under the id ""
MAX_BYTES = 64 * 1024
CLOCK_SKEW = 300.0
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
KID = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")  # a key id; also a Secret data key `<kid>.key`


class AssignmentError(ValueError):
    """The annotation is missing a field, malformed, forged, stale or for someone else."""


@dataclass(frozen=True, slots=True)
class Assignment:
    node: str
    pod_uid: str
    issued: float
    containers: Mapping[str, tuple[Grant, ...]]
    kid: str = ""  # the key id that signed it; "" for version 1
    # Per container name, the RuntimeProfile resolved at bind; empty for most pods.
    runtime: Mapping[str, ResolvedRuntime] = field(default_factory=lambda: _NO_RUNTIME)


_NO_RUNTIME: Mapping[str, ResolvedRuntime] = MappingProxyType({})


def build(
    node: str,
    pod_uid: str,
    issued: float,
    containers: Mapping[str, Sequence[Grant]],
    kid: str = "",
    *,
    runtime: Mapping[str, ResolvedRuntime] = _NO_RUNTIME,
) -> dict[str, Any]:
    """The unsigned body for a pod's grants per container (`issued`: unix seconds); version 2
    naming `kid`, or version 1 (what older nodes verify) when `kid` is empty; version 3 when
    a container has a resolved runtime profile (which needs `kid`)."""
    if runtime and not kid:
        raise ValueError("a runtime profile needs a version 3 assignment, which names its key")
    unknown = sorted(set(runtime) - set(containers))
    if unknown:
        raise ValueError(f"runtime profiles for containers without grants: {unknown}")
    head: dict[str, Any] = {"v": VERSION, "kid": kid} if kid else {"v": LEGACY_VERSION}
    if runtime:
        head = {
            "v": RUNTIME_VERSION,
            "kid": kid,
            "runtime": {name: runtime_binding.dump(r) for name, r in runtime.items()},
        }
    return {
        **head,
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
    body = build(
        assignment.node,
        assignment.pod_uid,
        assignment.issued,
        assignment.containers,
        assignment.kid,
        runtime=assignment.runtime,
    )
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


def _kid(body: Mapping[str, Any]) -> str:
    """The key id the body names ("" for version 1)."""
    version = body.get("v")
    if version not in (RUNTIME_VERSION, VERSION, LEGACY_VERSION) or isinstance(version, bool):
        raise AssignmentError(f"{ANNOTATION} version {version!r} is not supported")
    if version == LEGACY_VERSION:
        return ""
    kid = _field(body, "kid", str)
    if not KID.fullmatch(kid):
        raise AssignmentError(f"{ANNOTATION} is malformed: 'kid' {kid[:40]!r} is not a key id")
    return str(kid)


def _assignment(body: Mapping[str, Any]) -> Assignment:
    kid = _kid(body)
    issued = body.get("issued")
    if not isinstance(issued, int | float) or isinstance(issued, bool) or not math.isfinite(issued):
        raise AssignmentError(f"{ANNOTATION} is malformed: 'issued' must be a finite number")
    containers = _field(body, "containers", dict)
    grants = {}
    for name, raw in containers.items():
        if not isinstance(raw, list):
            raise AssignmentError(f"{ANNOTATION} is malformed: container {name!r} needs a list")
        grants[name] = tuple(_grant(g) for g in raw)
    node, pod_uid = _field(body, "node", str), _field(body, "pod_uid", str)
    return Assignment(node, pod_uid, issued, grants, kid, _runtime(body, grants))


def _runtime(body: Mapping[str, Any], grants: Mapping[str, Any]) -> Mapping[str, ResolvedRuntime]:
    """Version 3's resolved profiles; none before it (a "runtime" there is refused: it was
    not part of what older nodes signed for)."""
    if body.get("v") != RUNTIME_VERSION:
        if "runtime" in body:
            raise AssignmentError(f"{ANNOTATION} is malformed: 'runtime' needs version 3")
        return _NO_RUNTIME
    try:
        resolved = runtime_binding.load_all(body.get("runtime"), tuple(grants))
    except RuntimeBindingError as e:
        raise AssignmentError(f"{ANNOTATION} is malformed: {e}") from e
    if not resolved:
        raise AssignmentError(f"{ANNOTATION} is malformed: version 3 without a runtime profile")
    return MappingProxyType(resolved)


def parse(text: str) -> Assignment:
    """The assignment as written, signature NOT checked: for the scheduler's own bookkeeping
    of what bound pods hold, never to hand out devices (that is `verify`)."""
    return _assignment(_load(text))


def verify(
    text: str,
    keys: Mapping[str, bytes],
    *,
    node: str,
    pod_uid: str,
    now: float,
    max_age: float,
) -> Assignment:
    """The assignment, if the key it names in `keys` (kid -> key) signed it for this node and
    pod within `max_age` seconds."""
    body = _load(text)
    signature = body.get("sig")
    if not isinstance(signature, str):
        raise AssignmentError(f"{ANNOTATION} has no signature")
    if not _SIGNATURE.fullmatch(signature):
        raise AssignmentError(
            f"{ANNOTATION} signature is not 64 lower-case hex digits (forged or damaged)"
        )
    if not keys:
        raise AssignmentError("no assignment key is configured on this node; cannot verify")
    kid = _kid(body)
    key = keys.get(kid)
    if not key:
        held = ", ".join(repr(k) for k in sorted(keys)) or "none"
        raise AssignmentError(
            f"{ANNOTATION} is signed with key id {kid!r}, which this node does not hold "
            f"(it holds {held}): a key not yet delivered, retired, or a forgery"
        )
    if not hmac.compare_digest(_signature(body, key).encode(), signature.encode()):
        raise AssignmentError(f"{ANNOTATION} signature does not verify (forged or wrong key)")
    assignment = _assignment(body)
    check_bound(assignment, node=node, pod_uid=pod_uid)
    issued = assignment.issued
    if issued > now + CLOCK_SKEW:
        raise AssignmentError(f"{ANNOTATION} was issued in the future ({issued - now:.0f}s)")
    if now - issued > max_age:
        raise AssignmentError(
            f"{ANNOTATION} is stale: issued {now - issued:.0f}s ago (limit {max_age:.0f}s)"
        )
    return assignment


def check_bound(assignment: Assignment, *, node: str, pod_uid: str) -> None:
    """Raise unless the assignment is for this node and pod."""
    if assignment.node != node:
        raise AssignmentError(f"{ANNOTATION} is for node {assignment.node}, this is {node}")
    if assignment.pod_uid != pod_uid:
        raise AssignmentError(f"{ANNOTATION} is for pod uid {assignment.pod_uid}, not {pod_uid}")


def digest(text: str) -> str:
    """What a node remembers of an accepted annotation (sha256 hex of its exact text)."""
    return hashlib.sha256(text.encode()).hexdigest()
