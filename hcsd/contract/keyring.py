"""Assignment keyrings: key ids, the per-node key derivation, and the files that hold them.

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

The node keyring file:
  {"node": "gpu-node", "signing": "k2",
   "keys": {"k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>"}}
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcsd.contract.keys import (
    MAX_KEY_BYTES,
    AssignmentKeyError,
    KeyFile,
    Readers,
    check_access,
    check_key,
    read_key,
)

__all__ = [
    "KID",
    "NODE_KEY_LABEL",
    "Keyring",
    "KeyringFile",
    "decode",
    "derive",
    "encode",
    "node_key",
    "read_keyring",
    "read_secret_dir",
    "write_keyring",
]

log = logging.getLogger(__name__)

KID = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")  # also a Secret data key: `<kid>.key`
NODE_KEY_LABEL = b"hcs.io/assignment node key v1\x00"
SIGNING_FILE = "signing"
RETIRED_FILE = "retired"
_KEY_FILE = re.compile(r"([a-z0-9][a-z0-9.-]{0,62})\.key")
MAX_FILE_BYTES = 64 * 1024


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


def read_keyring(path: str | Path, *, node: str) -> Keyring:
    """hcsd's keyring file, after the checks `Readers.NODE` applies to a key file, and only
    if it holds `node`'s keys."""
    where = str(path)
    try:
        with open(where, "rb") as f:
            check_access(where, os.fstat(f.fileno()), Readers.NODE)
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError as e:
        raise AssignmentKeyError(f"no assignment keyring at {where}") from e
    except OSError as e:
        raise AssignmentKeyError(f"cannot read the assignment keyring {where}: {e}") from e
    if len(data) > MAX_FILE_BYTES:
        raise AssignmentKeyError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
    keyring = decode(data, where)
    if keyring.node != node:
        raise AssignmentKeyError(
            f"{where} holds the keys of node {keyring.node!r}, this node is {node!r}"
        )
    return keyring


def write_keyring(path: str | Path, keyring: Keyring) -> bool:
    """Store the keyring atomically, 0600 (write, fsync, rename, fsync the directory); False
    when the file already holds exactly it."""
    target = Path(path)
    text = encode(keyring).encode()
    try:
        if target.read_bytes() == text and (target.stat().st_mode & 0o777) == 0o600:
            return False
    except OSError:
        pass
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return True


def read_secret_dir(directory: str | Path) -> Keyring:
    """The cluster keyring from the Secret's volume: `<kid>.key` files and `signing`."""
    where = Path(directory)
    try:
        names = sorted(os.listdir(where))
    except OSError as e:
        raise AssignmentKeyError(f"cannot list the assignment keys in {where}: {e}") from e
    keys = {}
    for name in names:
        match = _KEY_FILE.fullmatch(name)
        if match:
            keys[match.group(1)] = read_key(where / name, readers=Readers.SECRET_VOLUME)
    if not keys:
        raise AssignmentKeyError(
            f"{where} holds no <kid>.key file: create the Secret as docs/cluster.md says"
        )
    signing_file = where / SIGNING_FILE
    try:
        with open(signing_file, "rb") as f:
            check_access(str(signing_file), os.fstat(f.fileno()), Readers.SECRET_VOLUME)
            signing = f.read(MAX_KEY_BYTES).decode(errors="replace").strip()
    except FileNotFoundError:
        if len(keys) != 1:
            raise AssignmentKeyError(
                f"{where} holds keys {', '.join(keys)} and no `signing` file naming the one "
                "that signs"
            ) from None
        signing = next(iter(keys))
    except OSError as e:
        raise AssignmentKeyError(f"cannot read {signing_file}: {e}") from e
    return Keyring(keys, signing, retired=_retired(where / RETIRED_FILE))


def _retired(path: Path) -> frozenset[str]:
    """The kids listed in the Secret's optional `retired` entry (spaces, commas or lines)."""
    try:
        with open(path, "rb") as f:
            check_access(str(path), os.fstat(f.fileno()), Readers.SECRET_VOLUME)
            text = f.read(MAX_KEY_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return frozenset()
    except OSError as e:
        raise AssignmentKeyError(f"cannot read {path}: {e}") from e
    return frozenset(text.replace(",", " ").split())


def _stamp(path: str) -> tuple[int, ...] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    # ctime: chmod and chown change it, and so the verdict
    return (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino)


class KeyringFile:
    """hcsd's keys, kid -> key, read again whenever a file changes (a stat per assignment).

    The keyring file (written by InstallKeys, or by hand), plus the single key file of
    earlier releases under the id "" when it is there (it verifies version-1 assignments
    signed before an upgrade). Calling it returns the keys or raises AssignmentKeyError with
    the reason; each change is logged once."""

    def __init__(
        self, path: str, node: str, *, legacy: str = "", log_to: logging.Logger = log
    ) -> None:
        self.path = path
        self.node = node
        self._legacy = KeyFile(legacy, log_to=log_to) if legacy else None
        self._log = log_to
        self._stamp: tuple[int, ...] | bool | None = False  # False: never read
        self._result: Keyring | AssignmentKeyError = AssignmentKeyError("not read yet")

    def _ring(self) -> Keyring | AssignmentKeyError:
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            first = self._stamp is False
            self._stamp = stamp
            try:
                self._result = read_keyring(self.path, node=self.node)
                if not first:
                    self._log.info(
                        "assignment keyring %s changed: key ids %s",
                        self.path,
                        ", ".join(sorted(self._result.keys)) or "none",
                    )
            except AssignmentKeyError as e:
                self._result = e
                if stamp is not None:
                    self._log.error("%s: assignments signed with its keys are refused", e)
        return self._result

    def __call__(self) -> dict[str, bytes]:
        ring = self._ring()
        keys = dict(ring.keys) if isinstance(ring, Keyring) else {}
        if self._legacy is not None and os.path.lexists(self._legacy.path):
            with contextlib.suppress(AssignmentKeyError):
                keys.setdefault("", self._legacy())
        if not keys:
            raise (
                ring
                if isinstance(ring, AssignmentKeyError)
                else AssignmentKeyError(f"the assignment keyring {self.path} holds no key")
            )
        return keys
