"""Each node's own assignment keys, handed out by the extender to that node's hcs-syncer only.

The extender holds the cluster keyring (the Secret `hcs-assignment-key`, `ClusterKeys`). A
syncer asks `GET /node-keys` on the extender's node-keys port (HTTPS) with its projected
service-account token (audience `hcs-node-keys`). The extender asks the API server who that
is (TokenReview) and answers only when:
- the token is valid for that audience (a token made for the API server is refused);
- the user is the syncer's service account (`system:serviceaccount:hcs-system:hcs-syncer`);
- the token is bound to a pod on a node, or to a Node: the API server then names the node in
  the user's extra `authentication.kubernetes.io/node-name` (Kubernetes 1.32 and later).
The answer is that node's derived keyring (hcsd.contract.keyring: kids, keys, the signing
kid; retired kids left out), never the cluster keys nor another node's. Reviews are cached for
a minute by the token's hash, so 5,000 syncers polling cost the API server little.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hcsd.cluster.kube import Kube, KubeError
from hcsd.contract.keyring import Keyring, derive, encode, read_secret_dir
from hcsd.contract.keys import AssignmentKeyError
from hcsd.contract.names import NAMESPACE, NODE_KEYS_AUDIENCE

__all__ = [
    "AUDIENCE",
    "NODE_NAME_EXTRA",
    "ClusterKeys",
    "NodeKeys",
    "Refused",
    "syncer_user",
]

log = logging.getLogger(__name__)

AUDIENCE = NODE_KEYS_AUDIENCE
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
_CACHE_SECONDS = 60.0
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
        self._lock = threading.Lock()  # guards _keys and _read_at
        self._keys = read_secret_dir(directory)  # at start, a bad Secret is fatal
        self._read_at = clock()

    def __call__(self) -> Keyring:
        with self._lock:
            if self.clock() - self._read_at < self.every:
                return self._keys
            self._read_at = self.clock()
            try:
                keys = read_secret_dir(self.directory)
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
    node: str
    until: float


class NodeKeys:
    """Who asks (TokenReview) and what that node gets."""

    def __init__(
        self,
        kube: Kube,
        keys: Callable[[], Keyring],
        *,
        user: str = syncer_user(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.keys = keys
        self.user = user
        self.clock = clock
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
                return cached.node
        node = self._review(token)
        with self._lock:
            self._cache[digest] = _Review(node, now + _CACHE_SECONDS)
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
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
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            why = status.get("error") or "not authenticated"
            raise Refused(401, f"the token is not valid for audience {AUDIENCE}: {why}")
        user = status.get("user") or {}
        name = str(user.get("username", ""))
        if name != self.user:
            raise Refused(403, f"{name} is not {self.user}: node keys go to hcs-syncer only")
        nodes = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or []
        if len(nodes) != 1 or not isinstance(nodes[0], str) or not nodes[0]:
            raise Refused(
                403,
                "the token is bound to no node (use the pod's projected token, or a token "
                f"bound to a Node): the API server names none in {NODE_NAME_EXTRA}",
            )
        return str(nodes[0])
