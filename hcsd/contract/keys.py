"""Assignment key files: one set of checks for every program that reads one.

A key is an HMAC-SHA256 key of `hcs.io/assignment` (hcsd.contract.assignment). The cluster's
keys live in the Kubernetes Secret `hcs-assignment-key`, which only the scheduler extender
reads, from a Secret volume (hcsd.contract.keyring: one `<kid>.key` file per key). hcsd reads
`/etc/hcsd/assignment.key`, the single key of earlier releases, while it is there.

The key is the file's bytes with surrounding whitespace stripped, used as they are (base64 text
is not decoded: every reader must agree on the bytes, and they always have). Rules, checked by
every reader:
- at least 32 bytes (`MIN_KEY_BYTES`). The documented `head -c 32 /dev/urandom | base64` gives
  44 bytes of base64 carrying 256 random bits; `secrets.token_hex(32)` gives 64;
- not the manifest's placeholder (packaging/kubernetes/secret.yaml);
- who may read the file:
  - `NODE` (hcsd's files): owned by this process's user, and
    no permission at all for group or others (0600 or 0400). Anyone else who can read it can
    forge assignments; anyone who can write it can swap it;
  - `SECRET_VOLUME` (the extender's Secret): nothing for others; the group may read
    (never write) only when the file's group is one of this process's own groups. That is how
    a Secret volume reaches a non-root container: mounted 0440 root:<fsGroup>, with fsGroup
    added to the container's groups (packaging/kubernetes/extender.yaml); the group is the
    pod's own. The owner is kubelet (root), not the process.
A file that breaks a rule is refused (never used with a warning) with a message that says how
to fix it.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Generic, TypeVar

from hcsd.contract.assignment import AssignmentError

__all__ = [
    "MIN_KEY_BYTES",
    "PLACEHOLDER",
    "AssignmentKeyError",
    "KeyFile",
    "Readers",
    "Reloaded",
    "check_access",
    "check_key",
    "file_stamp",
    "read_key",
]

log = logging.getLogger(__name__)

PLACEHOLDER = b"REPLACE-WITH-32-RANDOM-BYTES"
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096  # a key file larger than this is not a key
_GENERATE = "head -c 32 /dev/urandom | base64"


class Readers(enum.Enum):
    """Who the file may be readable by, besides its owner (see the module's docstring)."""

    NODE = "node"
    SECRET_VOLUME = "secret-volume"  # noqa: S105 - a kind of file, not a secret


class AssignmentKeyError(AssignmentError):
    """The key file is missing, unreadable, too open, the placeholder or too short.

    An `AssignmentError`: without a usable key, no assignment can be verified."""


def check_key(key: bytes, where: str) -> bytes:
    """`key` (already stripped) if it may sign or verify assignments."""
    if key == PLACEHOLDER:
        raise AssignmentKeyError(
            f"{where} holds the manifest's placeholder: create the Secret with a random key "
            f"({_GENERATE}; see packaging/kubernetes/secret.yaml)"
        )
    if len(key) < MIN_KEY_BYTES:
        raise AssignmentKeyError(
            f"the assignment key in {where} is {len(key)} bytes; use at least {MIN_KEY_BYTES} "
            f"(e.g. {_GENERATE})"
        )
    return key


def check_access(path: str, info: os.stat_result, readers: Readers) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        raise AssignmentKeyError(f"assignment key {path} is not a regular file")
    if readers is Readers.NODE:
        if info.st_uid != os.geteuid():
            raise AssignmentKeyError(
                f"assignment key {path} is owned by uid {info.st_uid}, not by this process "
                f"(uid {os.geteuid()}): chown {os.geteuid()} {path}"
            )
        if mode & 0o077:
            raise AssignmentKeyError(
                f"assignment key {path} is open to group or others (mode {mode:04o}): "
                f"chmod 0600 {path}"
            )
        return
    own_groups = {os.getegid(), *os.getgroups()}
    if mode & 0o007 or mode & 0o020:
        raise AssignmentKeyError(
            f"assignment key {path} is open to others or group-writable (mode {mode:04o}): "
            f"mount the Secret with defaultMode 0400 (or 0440 with the pod's fsGroup)"
        )
    if mode & 0o040 and info.st_gid not in own_groups:
        raise AssignmentKeyError(
            f"assignment key {path} is readable by group {info.st_gid}, which is not this "
            f"process's (mode {mode:04o}): mount the Secret with defaultMode 0400, or 0440 "
            "with the pod's fsGroup"
        )


def read_protected(where: str, *, readers: Readers, limit: int, what: str) -> bytes:
    """Up to `limit` + 1 bytes of `where`, after `check_access` on the open file (so the
    checked file is the read one); AssignmentKeyError names `what` it is and why not.
    The caller judges the size: a key file and a keyring say "too large" in their own words."""
    try:
        with open(where, "rb") as f:
            check_access(where, os.fstat(f.fileno()), readers)
            return f.read(limit + 1)
    except FileNotFoundError as e:
        raise AssignmentKeyError(f"no {what} at {where}") from e
    except OSError as e:
        raise AssignmentKeyError(f"cannot read the {what} {where}: {e.strerror}") from e


def read_key(path: str | Path, *, readers: Readers = Readers.NODE) -> bytes:
    """The key in `path` after every check; AssignmentKeyError says what is wrong."""
    where = str(path)
    key = read_protected(where, readers=readers, limit=MAX_KEY_BYTES, what="assignment key").strip()
    if len(key) > MAX_KEY_BYTES:
        raise AssignmentKeyError(f"{where} is larger than {MAX_KEY_BYTES} bytes: not a key")
    return check_key(key, where)


T = TypeVar("T")
_NEVER: tuple[int, ...] = (-1,)  # the stamp before the first read


def file_stamp(path: str) -> tuple[int, ...] | None:
    """What changes when the file is replaced, rewritten, chmod-ed or chown-ed (ctime: the
    checks' verdict can change with them); None when it is not there."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino)


class Reloaded(ABC, Generic[T]):
    """A value read from a file again whenever the file changes: on a Kubernetes node
    hcs-syncer installs keys after hcsd has started and replaces them at each rotation. A
    stat per use is all a steady state costs. Subclasses say how to read (`_read`, raising
    AssignmentKeyError) and what to log when the result changes (`_report`)."""

    def __init__(self, path: str, *, log_to: logging.Logger = log) -> None:
        self.path = path
        self._log = log_to
        self._stamp: tuple[int, ...] | None = _NEVER
        self._result: T | AssignmentKeyError = AssignmentKeyError("not read yet")

    @abstractmethod
    def _read(self) -> T:
        """The value from the file; AssignmentKeyError when there is none."""

    def _report(self, first: bool) -> None:
        """Called after each read (`first`: the first one)."""

    def current(self) -> T | AssignmentKeyError:
        """The value, or the reason there is none, read again if the file changed."""
        stamp = file_stamp(self.path)
        if stamp != self._stamp:
            first = self._stamp == _NEVER
            self._stamp = stamp
            try:
                self._result = self._read()
            except AssignmentKeyError as e:
                self._result = e
            self._report(first)
        return self._result

    @property
    def missing(self) -> bool:
        """The file was not there at the last look."""
        return self._stamp is None


class KeyFile(Reloaded[bytes]):
    """hcsd's single key of earlier releases (`read_key`'s checks). Calling it returns the
    key or raises AssignmentKeyError with the reason; each change is logged once."""

    def __init__(
        self, path: str, *, readers: Readers = Readers.NODE, log_to: logging.Logger = log
    ) -> None:
        super().__init__(path, log_to=log_to)
        self.readers = readers

    def _read(self) -> bytes:
        return read_key(self.path, readers=self.readers)

    def __call__(self) -> bytes:
        result = self.current()
        if isinstance(result, AssignmentKeyError):
            raise result
        return result

    def _report(self, first: bool) -> None:
        result = self._result
        if isinstance(result, bytes):
            if not first:
                self._log.info("assignment key %s changed: loaded it", self.path)
        elif first and self._stamp is None:
            self._log.warning(
                "%s: scheduler assignments cannot be verified and will be refused; local "
                "hcs.io/* requests still work",
                result,
            )
        else:
            self._log.error("%s: scheduler assignments will be refused until it is fixed", result)
