"""Each node's own assignment keys, handed out by the extender to that node's hcs-syncer only.

The extender holds the cluster keyring (the Secret `hcs-assignment-key`, `ClusterKeys`). A
syncer asks `GET /node-keys` on the extender's node-keys port (HTTPS) with its projected
service-account token (audience `hcs-node-keys`). The extender asks the API server who that
is (TokenReview) and answers only when:
- the token is valid for that audience (a token made for the API server is refused), and the
  answer's `audiences` says so;
- the user is the syncer's service account (`system:serviceaccount:hcs-system:hcs-syncer`);
- the token is bound to a pod on a node, or to a Node: the API server then names the node in
  the user's extra `authentication.kubernetes.io/node-name` (Kubernetes 1.32 and later).
The answer is that node's derived keyring (hcsd.contract.keyring: kids, keys, the signing
kid; retired kids left out), never the cluster keys nor another node's. Reviews are cached by
the token's hash (`NodeKeys`), so 5,000 syncers polling cost the API server little.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.keyring import Keyring, derive, encode
from hcsd.contract.keyring_files import read_secret_dir
from hcsd.contract.keys import AssignmentKeyError
from hcsd.contract.names import NAMESPACE, NODE_KEYS_AUDIENCE

__all__ = [
    "AUDIENCE",
    "NODE_NAME_EXTRA",
    "ClusterKeys",
    "NodeKeys",
    "Refused",
    "node_of_review",
    "syncer_user",
    "token_expiry",
]

log = logging.getLogger(__name__)

AUDIENCE = NODE_KEYS_AUDIENCE
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
_CACHE_SECONDS = 600.0  # a syncer fetches every minute: ten fetches per review
_REFUSAL_SECONDS = 10.0
_CACHE_SIZE = 20_000


def syncer_user(namespace: str = NAMESPACE, account: str = "hcs-syncer") -> str:
    return f"system:serviceaccount:{namespace}:{account}"


class Refused(Exception):
    """The caller gets no keys: `status` is the HTTP answer (401 or 403), the text why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ClusterKeys:
    """The cluster keyring from the Secret volume, read again every `every` seconds: kubelet
    updates a mounted Secret in place (within about a minute), so a rotation step needs no
    restart. A read that fails keeps the last good keyring and says why."""

    def __init__(
        self,
        directory: str | Path,
        *,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.every = every
        self.clock = clock
        self._lock = threading.Lock()  # guards _keys, _read_at and _problems
        self._problems: list[str] = []
        self._keys = self._read()  # at start, a Secret that cannot sign is fatal
        self._read_at = clock()

    def _read(self) -> Keyring:
        """Read the Secret; say its problems (read_secret_dir) when they change, not at
        every read."""
        problems: list[str] = []
        keys = read_secret_dir(self.directory, problems)
        if problems != self._problems:
            for problem in problems:
                log.warning("assignment keys in %s: %s", self.directory, problem)
            self._problems = problems
        return keys

    def __call__(self) -> Keyring:
        with self._lock:
            if self.clock() - self._read_at < self.every:
                return self._keys
            self._read_at = self.clock()
            try:
                keys = self._read()
            except AssignmentKeyError as e:
                log.error("%s: keeping the keys read before", e)
                return self._keys
            if keys != self._keys:
                log.info(
                    "assignment keys changed: ids %s, signing with %s, retired %s",
                    ", ".join(sorted(keys.keys)),
                    keys.signing,
                    ", ".join(sorted(keys.retired)) or "none",
                )
            self._keys = keys
            return keys


@dataclass(frozen=True, slots=True)
class _Review:
    node: str | Refused  # the caller's node, or why it gets nothing
    until: float  # monotonic


def token_expiry(token: str) -> float | None:
    """The `exp` claim (unix seconds) of a JWT, read WITHOUT checking its signature: only to
    keep a cached review no longer than the token lives (the API server decided its
    validity). None when the token is no JWT or carries no numeric exp."""
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > 8192:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if not isinstance(exp, int | float) or isinstance(exp, bool) or not math.isfinite(exp):
        return None
    return float(exp)


class NodeKeys:
    """Who asks (TokenReview) and what that node gets.

    A review is cached by the token's hash: a success for `cache_seconds` (longer than a
    syncer's fetch interval, so a syncer costs the API server one review per that time),
    never past the token's own expiry; a refusal (401/403) for `refusal_seconds`, so a caller
    repeating a bad token does not turn each request into an API call. At most `cache_size`
    entries, the oldest dropped first."""

    def __init__(
        self,
        kube: Kube,
        keys: Callable[[], Keyring],
        *,
        user: str = syncer_user(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        cache_seconds: float = _CACHE_SECONDS,
        refusal_seconds: float = _REFUSAL_SECONDS,
        cache_size: int = _CACHE_SIZE,
    ) -> None:
        self.kube = kube
        self.keys = keys
        self.user = user
        self.clock = clock
        self.wall = wall
        self.cache_seconds = cache_seconds
        self.refusal_seconds = refusal_seconds
        self.cache_size = cache_size
        self._lock = threading.Lock()  # guards _cache
        self._cache: OrderedDict[str, _Review] = OrderedDict()

    def answer(self, authorization: str) -> str:
        """The caller's node keyring as JSON; Refused says why not."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "send the syncer's service-account token as a Bearer token")
        node = self._node_of(token.strip())
        return encode(derive(self.keys(), node).active())

    def _node_of(self, token: str) -> str:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None and cached.until > now:
            if isinstance(cached.node, Refused):
                raise cached.node
            return cached.node
        try:
            node: str | Refused = self._review(token)
            lifetime = self.cache_seconds
            expiry = token_expiry(token)
            if expiry is not None:
                lifetime = min(lifetime, expiry - self.wall())
        except Refused as e:
            if e.status == 503:  # the API server's trouble, not the caller's: ask again
                raise
            node, lifetime = e, self.refusal_seconds
        with self._lock:
            self._cache.pop(digest, None)
            if lifetime > 0:
                self._cache[digest] = _Review(node, now + lifetime)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if isinstance(node, Refused):
            raise node
        return node

    def _review(self, token: str) -> str:
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [AUDIENCE]},
        }
        try:
            answer = self.kube.create("/apis/authentication.k8s.io/v1/tokenreviews", review)
        except KubeError as e:
            raise Refused(503, f"cannot review the token now: {e}") from e
        return node_of_review(answer, self.user)


def node_of_review(answer: Mapping[str, Any], user: str) -> str:
    """The node a TokenReview's answer names for `user`; Refused unless the API server
    authenticated the token for the audience `AUDIENCE` (an API server that ignores the
    requested audiences answers without it), the user is `user`, and exactly one node name."""
    status = answer.get("status") or {}
    if not isinstance(status, dict) or status.get("authenticated") is not True:
        why = status.get("error") if isinstance(status, dict) else None
        raise Refused(401, f"the token is not valid for audience {AUDIENCE}: {why or 'no'}")
    audiences = status.get("audiences")
    if not isinstance(audiences, list) or AUDIENCE not in audiences:
        raise Refused(
            401,
            f"the API server did not confirm the audience {AUDIENCE} for the token "
            f"(audiences {audiences!r:.100})",
        )
    found = status.get("user") or {}
    name = str(found.get("username", "")) if isinstance(found, dict) else ""
    if name != user:
        raise Refused(403, f"{name[:100]} is not {user}: node keys go to hcs-syncer only")
    extra = found.get("extra") or {}
    nodes = extra.get(NODE_NAME_EXTRA) if isinstance(extra, dict) else None
    if (
        not isinstance(nodes, list)
        or len(nodes) != 1
        or not isinstance(nodes[0], str)
        or not nodes[0]
    ):
        raise Refused(
            403,
            "the token is bound to no node (use the pod's projected token, or a token "
            f"bound to a Node): the API server names none in {NODE_NAME_EXTRA}",
        )
    return nodes[0]
