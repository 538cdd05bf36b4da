"""The files that hold keyrings (hcsd.contract.keyring): the extender's Secret volume and
hcsd's keyring file, and hcsd's view of its keys that follows that file.

The Secret (`hcs-assignment-key`, read only by the scheduler extender): one file `<kid>.key`
per key (at least 32 bytes, hcsd.contract.keys' checks), one file `signing` naming the kid the
extender signs with, and optionally `retired` naming kids the nodes no longer get.

hcsd's keyring is one JSON file (keyring.encode), 0600 root, written by InstallKeys (hcs-syncer
fetches the keys from the extender) or by an operator by hand:
  {"node": "gpu-node", "signing": "k2",
   "keys": {"k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>"}}
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

from hcsd.contract.assignment import KID
from hcsd.contract.keyring import LEGACY_KID, Keyring, decode, encode
from hcsd.contract.keys import (
    MAX_KEY_BYTES,
    AssignmentKeyError,
    KeyFile,
    Readers,
    Reloaded,
    read_key,
    read_protected,
)
from hcsd.fs import OsFileSystem, write_atomic

__all__ = [
    "MAX_FILE_BYTES",
    "KeyringFile",
    "read_keyring",
    "read_secret_dir",
    "write_keyring",
]

log = logging.getLogger(__name__)

SIGNING_FILE = "signing"
RETIRED_FILE = "retired"
_KEY_FILE = re.compile(rf"({KID.pattern})\.key")
MAX_FILE_BYTES = 64 * 1024  # hcsd's keyring file: what InstallKeys writes, what hcsd reads


def read_keyring(path: str | Path, *, node: str) -> Keyring:
    """hcsd's keyring file, after the checks `Readers.NODE` applies to a key file, and only
    if it holds `node`'s keys."""
    where = str(path)
    data = read_protected(
        where, readers=Readers.NODE, limit=MAX_FILE_BYTES, what="assignment keyring"
    )
    if len(data) > MAX_FILE_BYTES:
        raise AssignmentKeyError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
    keyring = decode(data, where)
    if keyring.node != node:
        raise AssignmentKeyError(
            f"{where} holds the keys of node {keyring.node!r}, this node is {node!r}"
        )
    return keyring


def write_keyring(path: str | Path, keyring: Keyring) -> bool:
    """Store the keyring atomically, 0600 (hcsd.fs.write_atomic); False when the file already
    holds exactly it. A keyring larger than `read_keyring` accepts is refused before anything
    is written (AssignmentKeyError), so a good file is never replaced by one hcsd cannot read."""
    target = Path(path)
    text = encode(keyring).encode()
    if len(text) > MAX_FILE_BYTES:
        raise AssignmentKeyError(
            f"the keyring is {len(text)} bytes encoded, more than the {MAX_FILE_BYTES} hcsd "
            f"reads ({len(keyring.active().keys)} keys): retire and remove old keys"
        )
    try:
        if target.read_bytes() == text and (target.stat().st_mode & 0o777) == 0o600:
            return False
    except OSError:
        pass
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(OsFileSystem(), str(target), text, mode=0o600)
    return True


def read_secret_dir(directory: str | Path, problems: list[str] | None = None) -> Keyring:
    """The cluster keyring from the Secret's volume: `<kid>.key` files, `signing`, `retired`.

    Whatever still leaves a key to sign with is worked around and said, never fatal: the
    extender must keep scheduling. Each such problem is appended to `problems` (logged as a
    warning when None): a key file that fails the checks, other than the signing one, is left
    out; several keys and no `signing` sign with `LEGACY_KID` (the Secret of earlier releases
    plus the first new key); `retired` naming an unknown or the signing kid ignores that name.
    AssignmentKeyError when no key can sign."""
    said: list[str] = [] if problems is None else problems
    where = Path(directory)
    try:
        names = sorted(os.listdir(where))
    except OSError as e:
        raise AssignmentKeyError(f"cannot list the assignment keys in {where}: {e}") from e
    keys, bad = {}, {}
    for name in names:
        match = _KEY_FILE.fullmatch(name)
        if match:
            try:
                keys[match.group(1)] = read_key(where / name, readers=Readers.SECRET_VOLUME)
            except AssignmentKeyError as e:
                bad[match.group(1)] = e
    signing = _signing(where, keys, bad, said)
    for kid, error in sorted(bad.items()):
        said.append(f"{error}: key id {kid!r} is left out")
    retired = _retired(where / RETIRED_FILE)
    if unknown := retired - set(keys) - {signing}:
        said.append(f"`retired` names {', '.join(sorted(unknown))}, not among the keys: ignored")
    if signing in retired:
        said.append(f"`retired` names the signing key id {signing!r}: it is not retired")
    if problems is None:
        for problem in said:
            log.warning("assignment keys in %s: %s", where, problem)
    return Keyring(keys, signing, retired=(retired & set(keys)) - {signing})


def _signing(
    where: Path, keys: dict[str, bytes], bad: dict[str, AssignmentKeyError], said: list[str]
) -> str:
    """The kid that signs: the `signing` file's, else the only key, else `LEGACY_KID`."""
    signing = _entry(where / SIGNING_FILE).strip()
    if signing in bad:
        raise bad[signing]
    if signing:
        if signing not in keys:
            raise AssignmentKeyError(
                f"the signing key id {signing!r} is not among the keys "
                f"({', '.join(sorted(keys)) or 'none'})"
            )
        return signing
    if not keys:
        if bad:
            raise next(iter(bad.values()))
        raise AssignmentKeyError(
            f"{where} holds no <kid>.key file: create the Secret as docs/cluster.md says"
        )
    if len(keys) == 1:
        return next(iter(keys))
    if LEGACY_KID in keys:
        said.append(
            f"keys {', '.join(sorted(keys))} and no `signing` entry: signing with "
            f"{LEGACY_KID!r} (the key of earlier releases) until the Secret names one"
        )
        return LEGACY_KID
    raise AssignmentKeyError(
        f"{where} holds keys {', '.join(sorted(keys))} and no `signing` file naming the one "
        "that signs"
    )


def _retired(path: Path) -> frozenset[str]:
    """The kids listed in the Secret's optional `retired` entry (spaces, commas or lines)."""
    return frozenset(_entry(path).replace(",", " ").split())


def _entry(path: Path) -> str:
    """A small optional entry of the Secret's volume (`signing`, `retired`) as text, after
    the volume's access checks; "" when the Secret has no such entry."""
    try:
        data = read_protected(
            str(path), readers=Readers.SECRET_VOLUME, limit=MAX_KEY_BYTES, what="Secret entry"
        )
    except AssignmentKeyError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return ""
        raise
    return data[:MAX_KEY_BYTES].decode(errors="replace")


class _RingFile(Reloaded[Keyring]):
    """hcsd's keyring file, followed."""

    def __init__(self, path: str, node: str, log_to: logging.Logger) -> None:
        super().__init__(path, log_to=log_to)
        self.node = node

    def _read(self) -> Keyring:
        return read_keyring(self.path, node=self.node)

    def _report(self, first: bool) -> None:
        result = self._result
        if isinstance(result, AssignmentKeyError):
            if self._stamp is not None:
                self._log.error("%s: assignments signed with its keys are refused", result)
        elif not first:
            self._log.info(
                "assignment keyring %s changed: key ids %s",
                self.path,
                ", ".join(sorted(result.keys)) or "none",
            )


class KeyringFile:
    """hcsd's keys, kid -> key, read again whenever a file changes (a stat per assignment).

    The keyring file (written by InstallKeys, or by hand), and the single key file of earlier
    releases under the id "" (version-1 assignments) ONLY while the keyring holds no key:
    every node held that one key, so root on any node could sign a version-1 assignment for
    any other. Once this node's own keys are here, the old file is refused loudly (delete
    it) and `legacy_ignored` says so. Calling it returns the keys or raises
    AssignmentKeyError with the reason; each change is logged once."""

    def __init__(
        self, path: str, node: str, *, legacy: str = "", log_to: logging.Logger = log
    ) -> None:
        self.path = path
        self.node = node
        self._ring = _RingFile(path, node, log_to)
        self._legacy = KeyFile(legacy, log_to=log_to) if legacy else None
        self._log = log_to
        self.legacy_ignored = False

    def __call__(self) -> dict[str, bytes]:
        ring = self._ring.current()
        keys = dict(ring.keys) if isinstance(ring, Keyring) else {}
        legacy = self._legacy
        ignored = False
        if legacy is not None and os.path.lexists(legacy.path):
            if keys:
                ignored = True
            else:
                with contextlib.suppress(AssignmentKeyError):  # KeyFile logged why
                    keys[""] = legacy()
        if ignored != self.legacy_ignored:
            self.legacy_ignored = ignored
            if ignored:
                self._log.warning(
                    "IGNORING THE OLD CLUSTER KEY %s: this node holds its own keys (%s), and "
                    "every node held that one, so it could sign for any node; version-1 "
                    "assignments are refused. Delete the file (docs/cluster.md, upgrading)",
                    legacy.path if legacy else "",
                    self.path,
                )
        if not keys:
            raise (
                ring
                if isinstance(ring, AssignmentKeyError)
                else AssignmentKeyError(f"the assignment keyring {self.path} holds no key")
            )
        return keys
