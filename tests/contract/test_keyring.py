"""Keyrings: per-node key derivation, the cluster Secret's files, hcsd's keyring file."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest

from hcsd.contract.assignment import Assignment, AssignmentError, encode, verify
from hcsd.contract.keyring import (
    Keyring,
    decode,
    derive,
    node_key,
    read_keyring,
    read_secret_dir,
    write_keyring,
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


def test_hcsd_stores_the_keyring_0600_and_reads_only_its_own(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "keyring.json"
    ring = derive(Keyring({"k1": CLUSTER}, "k1"), "node-a")
    old = os.umask(0)
    try:
        assert write_keyring(path, ring)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert not write_keyring(path, ring)  # unchanged: no write
    assert read_keyring(path, node="node-a") == ring
    with pytest.raises(AssignmentKeyError, match="keys of node 'node-a', this node is 'node-b'"):
        read_keyring(path, node="node-b")
    path.chmod(0o644)
    with pytest.raises(AssignmentKeyError, match="chmod 0600"):
        read_keyring(path, node="node-a")


def _secret(directory: Path, files: dict[str, bytes]) -> Path:
    """A Secret volume as kubelet lays it out: files are links into a `..data` directory."""
    data = directory / "..2026_11_23"
    data.mkdir(parents=True)
    for name, value in files.items():
        (data / name).write_bytes(value)
        (data / name).chmod(0o400)
    (directory / "..data").symlink_to(data.name)
    for name in files:
        (directory / name).symlink_to(f"..data/{name}")
    return directory


def test_the_secret_lists_keys_by_id_and_names_the_signing_one(tmp_path: Path) -> None:
    secret = _secret(
        tmp_path / "s", {"k1.key": b"a" * 44 + b"\n", "k2.key": b"b" * 44, "signing": b"k2\n"}
    )
    assert read_secret_dir(secret) == Keyring({"k1": b"a" * 44, "k2": b"b" * 44}, "k2")
    one = _secret(tmp_path / "one", {"k1.key": b"a" * 44})
    assert read_secret_dir(one).signing == "k1"  # a single key signs without being named
    # The Secret of earlier releases (one `assignment.key`) is a keyring of one: kid "assignment"
    old = _secret(tmp_path / "old", {"assignment.key": b"a" * 44})
    assert read_secret_dir(old) == Keyring({"assignment": b"a" * 44}, "assignment")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param({"k1.key": b"a" * 44, "k2.key": b"b" * 44}, "no `signing` file", id="two"),
        pytest.param({"k1.key": b"a" * 44, "signing": b"k3"}, "'k3' is not among", id="gone"),
        pytest.param({"k1.key": b"short", "signing": b"k1"}, "5 bytes", id="short-key"),
        pytest.param({"key": b"a" * 44}, "no <kid>.key", id="no-key-file"),
    ],
)
def test_a_secret_that_cannot_sign_is_refused(
    tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    with pytest.raises(AssignmentKeyError, match=message):
        read_secret_dir(_secret(tmp_path / "s", files))


def test_retired_keys_stay_with_the_extender_and_never_reach_a_node(tmp_path: Path) -> None:
    """Step 3 of a rotation: nodes drop k1, while the extender can still check the
    assignments of pods that run with it (their quota and node usage keep counting)."""
    secret = _secret(
        tmp_path / "s",
        {"k1.key": b"a" * 44, "k2.key": b"b" * 44, "signing": b"k2", "retired": b"k1\n"},
    )
    cluster = read_secret_dir(secret)
    assert cluster.retired == {"k1"}
    node = derive(cluster, "node-a")
    assert set(node.keys) == {"k1", "k2"}  # the extender's view, to check running pods
    assert set(node.active().keys) == {"k2"}
    assert set(decode(encode_keyring(node)).keys) == {"k2"}  # what the node is handed
    with pytest.raises(AssignmentKeyError, match="not the signing one"):
        Keyring({"k1": b"a" * 32}, "k1", retired=frozenset({"k1"}))
    with pytest.raises(AssignmentKeyError, match="must be among the keys"):
        Keyring({"k1": b"a" * 32}, "k1", retired=frozenset({"k0"}))
