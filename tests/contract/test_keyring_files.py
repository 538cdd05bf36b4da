"""Keyring files: the cluster Secret's volume, hcsd's keyring file and its view of its keys."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hcsd.contract.assignment import Assignment, AssignmentError, encode, verify
from hcsd.contract.keyring import Keyring, decode, derive
from hcsd.contract.keyring import encode as encode_keyring
from hcsd.contract.keyring_files import (
    MAX_FILE_BYTES,
    KeyringFile,
    read_keyring,
    read_secret_dir,
    write_keyring,
)
from hcsd.contract.keys import AssignmentKeyError

CLUSTER = b"c" * 44
OLD = b"o" * 44  # the single cluster key of earlier releases, on every node
NOW = 1_763_800_000.0


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


def test_a_keyring_larger_than_hcsd_reads_is_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "keyring.json"
    good = derive(Keyring({"k1": CLUSTER}, "k1"), "node-a")
    write_keyring(path, good)
    many = Keyring({f"k{i}": bytes([i % 256]) * 400 for i in range(200)}, "k1", "node-a")
    with pytest.raises(AssignmentKeyError, match=f"more than the {MAX_FILE_BYTES} hcsd reads"):
        write_keyring(path, many)
    assert read_keyring(path, node="node-a") == good  # the good file is still there


def _node(tmp_path: Path, *, keyring: bool) -> KeyringFile:
    """Node B after the upgrade: the old single key file is still there, and (`keyring`)
    hcs-syncer has installed B's own keys."""
    legacy = tmp_path / "assignment.key"
    legacy.write_bytes(OLD)
    legacy.chmod(0o600)
    path = tmp_path / "keyring.json"
    if keyring:
        write_keyring(path, derive(Keyring({"k2": CLUSTER}, "k2"), "node-b"))
    return KeyringFile(str(path), "node-b", legacy=str(legacy))


def test_a_node_with_its_own_keys_refuses_version_1_signed_with_the_old_cluster_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Root on node A still has the old cluster key every node held: what it signs for B
    as version 1 must not verify on B once B holds its own keys."""
    keys = _node(tmp_path, keyring=True)
    forged = encode(Assignment("node-b", "uid-1", NOW, {}), OLD)
    with caplog.at_level(logging.WARNING):
        held = keys()
    assert set(held) == {"k2"}
    with pytest.raises(AssignmentError, match="key id ''"):
        verify(forged, held, node="node-b", pod_uid="uid-1", now=NOW, max_age=600)
    assert keys.legacy_ignored
    assert "IGNORING THE OLD CLUSTER KEY" in caplog.text
    assert "Delete the file" in caplog.text
    caplog.clear()
    keys()
    assert "IGNORING" not in caplog.text  # said once, not per assignment


def test_a_node_without_a_keyring_still_accepts_version_1(tmp_path: Path) -> None:
    """An upgraded hcsd before its syncer delivered keys, and an old extender: unchanged."""
    keys = _node(tmp_path, keyring=False)
    v1 = encode(Assignment("node-b", "uid-1", NOW, {}), OLD)
    assert verify(v1, keys(), node="node-b", pod_uid="uid-1", now=NOW, max_age=600).kid == ""
    assert not keys.legacy_ignored


def test_rotation_step_1_on_an_upgraded_secret_keeps_signing_with_the_old_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Secret of earlier releases has `assignment.key` and no `signing`; step 1 of a
    rotation adds `k2.key`. The extender must go on (signing with the old key), not stop."""
    secret = _secret(tmp_path / "s", {"assignment.key": b"a" * 44, "k2.key": b"b" * 44})
    problems: list[str] = []
    ring = read_secret_dir(secret, problems)
    assert ring == Keyring({"assignment": b"a" * 44, "k2": b"b" * 44}, "assignment")
    assert problems == [
        "keys assignment, k2 and no `signing` entry: signing with 'assignment' (the key of "
        "earlier releases) until the Secret names one"
    ]
    with caplog.at_level(logging.WARNING):
        read_secret_dir(secret)
    assert "signing with 'assignment'" in caplog.text


@pytest.mark.parametrize(
    ("files", "ring", "problem"),
    [
        pytest.param(
            {"k1.key": b"short", "k2.key": b"b" * 44, "signing": b"k2"},
            Keyring({"k2": b"b" * 44}, "k2"),
            "5 bytes",
            id="bad-other-key",
        ),
        pytest.param(
            {"k2.key": b"b" * 44, "signing": b"k2", "retired": b"k1"},
            Keyring({"k2": b"b" * 44}, "k2"),
            "`retired` names k1, not among the keys: ignored",
            id="retired-removed-key",
        ),
        pytest.param(
            {"k1.key": b"a" * 44, "k2.key": b"b" * 44, "signing": b"k2", "retired": b"k2 k1"},
            Keyring({"k1": b"a" * 44, "k2": b"b" * 44}, "k2", retired=frozenset({"k1"})),
            "`retired` names the signing key id 'k2'",
            id="retired-signing-key",
        ),
    ],
)
def test_a_secret_problem_that_leaves_a_signing_key_is_said_not_fatal(
    tmp_path: Path, files: dict[str, bytes], ring: Keyring, problem: str
) -> None:
    problems: list[str] = []
    assert read_secret_dir(_secret(tmp_path / "s", files), problems) == ring
    assert any(problem in p for p in problems), problems
