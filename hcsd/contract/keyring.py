"""Assignment keyrings: key ids, the per-node key derivation, and their JSON form.

Who holds what:
- the cluster keyring (the Kubernetes Secret `hcs-assignment-key`, read only by the scheduler
  extender): one file `<kid>.key` per key (at least 32 bytes, hcsd.contract.keys' checks),
  one file `signing` naming the kid the extender signs with, and optionally `retired`
  naming kids the nodes no longer get (the extender still checks the assignments of running
  pods with them, for its accounting);
- a node's keyring: for each cluster key, the node's own key derived from it (`node_key`),
  under the same kid. The extender signs each node's assignments with that node's key, so a
  node's keys verify only assignments for that node: root on one node cannot sign for another.
  hcsd keeps it in one JSON file (`NODE_KEYRING` format below, 0600 root), written by
  InstallKeys (hcs-syncer fetches the keys from the extender) or by an operator by hand.

A rotation adds a kid, moves `signing` to it, retires the old one, and removes it once no
running pod's assignment names it (docs/cluster.md);
hcsd verifies with whichever kid an assignment names, so no step refuses a container.

The Secret of earlier releases holds one `assignment.key`: the kid `LEGACY_KID`. Version-1
assignments (no kid) were signed with that key as it is, not derived: the extender checks
them with it (`verifying_keys`); a node checks them with its own copy of that key, the single
key file of those releases, only until it holds a keyring (keyring_files.KeyringFile), since
every node held that key and could sign for any other.

The files that hold keyrings: hcsd.contract.keyring_files.

The node keyring file:
  {"node": "gpu-node", "signing": "k2",
   "keys": {"k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>"}}
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hcsd.contract.assignment import KID
from hcsd.contract.keys import AssignmentKeyError, check_key

__all__ = [
    "KID",
    "LEGACY_KID",
    "NODE_KEY_LABEL",
    "Keyring",
    "decode",
    "derive",
    "encode",
    "node_key",
    "verifying_keys",
]

NODE_KEY_LABEL = b"hcs.io/assignment node key v1\x00"
LEGACY_KID = "assignment"  # the Secret of earlier releases: one `assignment.key`


def node_key(cluster_key: bytes, node: str) -> bytes:
    """The key that signs and verifies `node`'s assignments: HMAC-SHA256(cluster key, label +
    node name). Knowing it says nothing about the cluster key or another node's key."""
    return hmac.new(cluster_key, NODE_KEY_LABEL + node.encode(), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class Keyring:
    """Keys by id and the id that signs ("" when this holder only verifies)."""

    keys: Mapping[str, bytes] = field(default_factory=dict)
    signing: str = ""
    node: str = ""  # whose derived keys these are; "" for the cluster keyring
    retired: frozenset[str] = frozenset()  # kept to check running pods' assignments only

    def __post_init__(self) -> None:
        for kid in self.keys:
            if kid and not KID.fullmatch(kid):
                raise AssignmentKeyError(f"key id {kid[:70]!r} is not [a-z0-9][a-z0-9.-]{{0,62}}")
        if self.signing and self.signing not in self.keys:
            raise AssignmentKeyError(
                f"the signing key id {self.signing!r} is not among the keys "
                f"({', '.join(sorted(self.keys)) or 'none'})"
            )

        if not self.retired <= set(self.keys) or self.signing in self.retired:
            raise AssignmentKeyError(
                f"retired key ids {', '.join(sorted(self.retired))} must be among the keys "
                f"and not the signing one ({self.signing!r})"
            )

    def active(self) -> Keyring:
        """The keys that are not retired: what a node gets."""
        keys = {kid: key for kid, key in self.keys.items() if kid not in self.retired}
        return Keyring(keys, self.signing, self.node)

    @property
    def signing_key(self) -> bytes:
        if not self.signing:
            raise AssignmentKeyError("no signing key id is set")
        return self.keys[self.signing]


def derive(cluster: Keyring, node: str) -> Keyring:
    """`node`'s keyring: each cluster key derived for it, same ids, same signing and retired
    ids (a node is handed `derive(...).active()`)."""
    keys = {kid: node_key(key, node) for kid, key in cluster.keys.items()}
    return Keyring(keys, cluster.signing, node, cluster.retired)


def verifying_keys(cluster: Keyring, node: str) -> dict[str, bytes]:
    """What checks an assignment for `node` on the extender's side, kid -> key: each cluster
    key derived for the node, and under the id "" (version 1) the Secret's `LEGACY_KID` key
    as it is, since version-1 assignments were signed with it underived."""
    keys = dict(derive(cluster, node).keys)
    legacy = cluster.keys.get(LEGACY_KID)
    if legacy is not None:
        keys[""] = legacy
    return keys


def encode(keyring: Keyring) -> str:
    """The node keyring as JSON (the file, InstallKeys' payload, the extender's answer): its
    active keys only, since retired ones are never a node's."""
    active = keyring.active()
    return json.dumps(
        {
            "node": active.node,
            "signing": active.signing,
            "keys": {k: base64.b64encode(v).decode() for k, v in sorted(active.keys.items())},
        },
        sort_keys=True,
    )


def decode(text: str | bytes, where: str = "keyring") -> Keyring:
    """The keyring `encode` wrote; AssignmentKeyError says what is wrong with anything else."""
    try:
        raw: Any = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise AssignmentKeyError(f"{where} is not JSON: {e}") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("keys"), dict):
        raise AssignmentKeyError(f'{where} must be an object with "keys": {{kid: base64}}')
    node, signing = raw.get("node", ""), raw.get("signing", "")
    if not isinstance(node, str) or not isinstance(signing, str):
        raise AssignmentKeyError(f'{where}: "node" and "signing" must be strings')
    keys = {}
    for kid, value in raw["keys"].items():
        try:
            key = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        except binascii.Error:
            key = b""
        keys[kid] = check_key(key, f"{where} (key id {kid!r})")
    return Keyring(keys, signing, node)
