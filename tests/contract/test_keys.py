"""The assignment key file: one set of checks for hcsd, hcs-syncer and the extender."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from hcsd.contract.keys import (
    MIN_KEY_BYTES,
    PLACEHOLDER,
    AssignmentKeyError,
    KeyFile,
    Readers,
    read_key,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = secrets.token_hex(32).encode()
OTHER_ID = 54321  # a user and group this process is not


def key_file(path: Path, content: bytes = KEY, mode: int = 0o600) -> Path:
    path.write_bytes(content + b"\n")
    path.chmod(mode)
    return path


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(PLACEHOLDER, "placeholder", id="placeholder"),
        pytest.param(b"x" * (MIN_KEY_BYTES - 1), "is 31 bytes; use at least 32", id="31-bytes"),
        pytest.param(b"k", "is 1 bytes", id="1-byte"),
        pytest.param(b"   \n", "is 0 bytes", id="blank"),
    ],
)
def test_keys_that_are_no_secret_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = key_file(tmp_path / "key", content)
    for readers in Readers:
        with pytest.raises(AssignmentKeyError, match=message):
            read_key(path, readers=readers)


def test_the_manifest_placeholder_is_the_one_refused() -> None:
    secret = yaml.safe_load((ROOT / "packaging" / "kubernetes" / "secret.yaml").read_text())
    assert secret["stringData"]["k1.key"].encode() == PLACEHOLDER


def test_the_documented_key_generation_passes(tmp_path: Path) -> None:
    """packaging/kubernetes/secret.yaml and docs/cluster.md: `head -c 32 /dev/urandom | base64`."""
    documented = (ROOT / "packaging" / "kubernetes" / "secret.yaml").read_text()
    command = documented.split("k1.key=$(", 1)[1].split(")", 1)[0]
    assert command == "head -c 32 /dev/urandom | base64"
    assert command in (ROOT / "docs" / "cluster.md").read_text()
    generated = subprocess.run(["sh", "-c", command], capture_output=True, check=True).stdout
    path = key_file(tmp_path / "key", generated.strip())
    assert read_key(path) == generated.strip()
    assert len(read_key(path)) == 44


def test_exactly_the_minimum_passes_and_whitespace_is_not_key(tmp_path: Path) -> None:
    path = key_file(tmp_path / "key", b"  " + b"k" * MIN_KEY_BYTES + b"\r\n")
    assert read_key(path) == b"k" * MIN_KEY_BYTES


@pytest.mark.parametrize(
    ("mode", "accepted"),
    [
        pytest.param(0o600, True, id="0600"),
        pytest.param(0o400, True, id="0400"),
        pytest.param(0o640, False, id="0640"),
        pytest.param(0o644, False, id="0644"),
        pytest.param(0o604, False, id="0604"),
        pytest.param(0o620, False, id="0620"),
        pytest.param(0o610, False, id="0610"),
    ],
)
def test_hcsd_accepts_only_owner_only_files(tmp_path: Path, mode: int, accepted: bool) -> None:
    path = key_file(tmp_path / "key", mode=mode)
    if accepted:
        assert read_key(path) == KEY
    else:
        with pytest.raises(AssignmentKeyError, match=rf"mode {mode:04o}\): chmod 0600 {path}"):
            read_key(path)


def test_hcsd_refuses_a_key_owned_by_someone_else(tmp_path: Path, as_root: None) -> None:
    path = key_file(tmp_path / "key")
    os.chown(path, OTHER_ID, -1)
    with pytest.raises(AssignmentKeyError, match=f"owned by uid {OTHER_ID}.*chown 0"):
        read_key(path)


@pytest.mark.parametrize(
    ("mode", "group", "accepted"),
    [
        pytest.param(0o400, "own", True, id="0400"),
        pytest.param(0o440, "own", True, id="0440-own-group"),  # the extender's fsGroup mount
        pytest.param(0o440, "other", False, id="0440-other-group"),
        pytest.param(0o460, "own", False, id="group-writable"),
        pytest.param(0o444, "own", False, id="0444"),
        pytest.param(0o404, "own", False, id="0404"),
    ],
)
def test_secret_volumes_may_be_read_by_the_pods_own_group(
    tmp_path: Path, as_root: None, mode: int, group: str, accepted: bool
) -> None:
    """As kubelet mounts a Secret: files behind `..data` symlinks, owned by root."""
    data = tmp_path / "..2026_01_01_00_00_00.1"
    data.mkdir()
    key_file(data / "assignment.key", mode=mode)
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "assignment.key").symlink_to("..data/assignment.key")
    os.chown(data / "assignment.key", OTHER_ID, os.getegid() if group == "own" else OTHER_ID)
    path = tmp_path / "assignment.key"
    if accepted:
        assert read_key(path, readers=Readers.SECRET_VOLUME) == KEY
    else:
        with pytest.raises(AssignmentKeyError, match=f"mode {mode:04o}"):
            read_key(path, readers=Readers.SECRET_VOLUME)
    with pytest.raises(AssignmentKeyError):  # never what hcsd itself accepts
        read_key(path)


def test_a_missing_key_says_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(AssignmentKeyError, match=f"no assignment key at {tmp_path}/absent"):
        read_key(tmp_path / "absent")
    with pytest.raises(AssignmentKeyError, match="not a regular file"):
        read_key("/dev/null")


def test_hcsd_reads_the_key_again_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "assignment.key"
    key = KeyFile(str(path))
    with pytest.raises(AssignmentKeyError, match="no assignment key"):
        key()  # absent: assignments refused, local requests still work
    first = secrets.token_hex(32).encode()
    key_file(path, first)
    assert key() == first
    rotated = secrets.token_hex(40).encode()
    key_file(path, rotated)
    assert key() == rotated
    path.chmod(0o644)
    for _ in range(3):
        with pytest.raises(AssignmentKeyError, match="chmod 0600"):
            key()
    path.chmod(0o600)
    assert key() == rotated
    path.unlink()
    with pytest.raises(AssignmentKeyError, match="no assignment key"):
        key()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("chmod 0600" in m for m in messages) == 1  # once per change, not per pod
    assert sum("changed: loaded it" in m for m in messages) == 3
