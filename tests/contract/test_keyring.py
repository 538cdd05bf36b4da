"""Keyrings: per-node key derivation, the cluster Secret's files, hcsd's keyring file."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from hcsd.contract.assignment import Assignment, AssignmentError, encode, verify
from hcsd.contract.keyring import (
    Keyring,
    decode,
    derive,
    node_key,
    verifying_keys,
)
from hcsd.contract.keyring import (
    encode as encode_keyring,
)
from hcsd.contract.keys import AssignmentKeyError

CLUSTER = b"c" * 44
NOW = 1_763_800_000.0


def test_node_keys_are_hmac_of_the_label_and_the_node_name() -> None:
    expected = hmac.new(CLUSTER, b"hcs.io/assignment node key v1\x00gpu-a", hashlib.sha256)
    assert node_key(CLUSTER, "gpu-a") == expected.digest()
    assert node_key(CLUSTER, "gpu-a") != node_key(CLUSTER, "gpu-b")
    assert node_key(CLUSTER, "gpu-a") != node_key(b"d" * 44, "gpu-a")


def test_a_key_derived_for_one_node_cannot_sign_for_another() -> None:
    """Root on node A holds A's keys only: what it signs for node B does not verify on B."""
    cluster = Keyring({"k1": CLUSTER}, "k1")
    node_a, node_b = derive(cluster, "node-a"), derive(cluster, "node-b")
    forged = encode(Assignment("node-b", "uid-1", NOW, {}, "k1"), node_a.signing_key)
    with pytest.raises(AssignmentError, match="does not verify"):
        verify(forged, node_b.keys, node="node-b", pod_uid="uid-1", now=NOW, max_age=600)
    genuine = encode(Assignment("node-b", "uid-1", NOW, {}, "k1"), node_b.signing_key)
    verify(genuine, node_b.keys, node="node-b", pod_uid="uid-1", now=NOW, max_age=600)


def test_the_keyring_encoding_round_trips_and_checks_every_key() -> None:
    ring = Keyring({"k1": b"a" * 32, "k2": b"b" * 32}, "k2", "node-a")
    assert decode(encode_keyring(ring)) == ring
    with pytest.raises(AssignmentKeyError, match=r"key id 'k1'.* 3 bytes"):
        decode('{"node": "n", "signing": "", "keys": {"k1": "YWJj"}}')
    with pytest.raises(AssignmentKeyError, match="not among the keys"):
        Keyring({"k1": b"a" * 32}, "k2")
    with pytest.raises(AssignmentKeyError, match="is not"):
        Keyring({"K/1": b"a" * 32})


def test_the_extender_checks_version_1_with_the_old_key_underived() -> None:
    """Pods bound before the upgrade carry version-1 assignments signed with the Secret's
    `assignment.key` as it is: the extender keeps counting them."""
    cluster = Keyring({"assignment": b"o" * 44, "k2": b"n" * 44}, "k2")
    v1 = encode(Assignment("node-a", "uid-1", NOW, {}), b"o" * 44)
    keys = verifying_keys(cluster, "node-a")
    assert verify(v1, keys, node="node-a", pod_uid="uid-1", now=NOW, max_age=600).kid == ""
    assert keys["k2"] == derive(cluster, "node-a").keys["k2"]
    assert "" not in verifying_keys(Keyring({"k2": b"n" * 44}, "k2"), "node-a")
