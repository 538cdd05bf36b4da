"""Installing the assignment key from the cluster's Secret onto the node for hcsd.

The syncer's pod mounts the Secret; hcsd (outside Kubernetes) reads a root-only file. The
copy is atomic (write, fsync, rename) so hcsd never reads half a key, and happens only when
the content differs, so a steady state writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["KeyError_", "install_key", "read_key"]

PLACEHOLDER = b"REPLACE-WITH-32-RANDOM-BYTES"
MIN_KEY_BYTES = 16


class KeyError_(ValueError):
    """The key is missing, the manifest's placeholder, or too short to be a secret."""


def read_key(path: str | Path) -> bytes:
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise KeyError_(f"cannot read the assignment key {path}: {e.strerror}") from e
    if key == PLACEHOLDER:
        raise KeyError_(
            f"{path} holds the manifest's placeholder: create the Secret with a random key "
            "(see packaging/kubernetes/secret.yaml)"
        )
    if len(key) < MIN_KEY_BYTES:
        raise KeyError_(f"the assignment key in {path} is {len(key)} bytes; use at least 16")
    return key


def install_key(source: str | Path, target: str | Path) -> bool:
    """Copy the key if it differs; True when the file was (re)written."""
    key = read_key(source)
    target = Path(target)
    try:
        if target.read_bytes().strip() == key:
            return False
    except OSError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    return True
