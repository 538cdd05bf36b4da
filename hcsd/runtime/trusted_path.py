"""Resolving a driver file's path under a host root so that only root could have chosen where it
leads.

Checking the last component alone is not enough: a directory on the way that another user may
write (or own) lets that user swap what the path names between the check and the mount. So
every component, from the root to the file, is looked at with `lstat`: each directory and the
file must be owned by root and not writable by group or others, and each link must be root's
(a link's own mode bits mean nothing). A root-owned directory with the sticky bit (/tmp) may be
writable by all: others may add names there but not rename or remove root's, and whatever they
add is theirs, so refused on the next step. Links are followed by hand, inside the root (an absolute
target and `..` at the top stay in the root, as in a chroot). The result is a path without any
link whose every component only root can change.
"""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_LINKS", "UntrustedPath", "resolve_trusted"]

MAX_LINKS = 40  # the kernel's limit on links followed in one lookup


class UntrustedPath(ValueError):
    """The path cannot be resolved, or something on the way is not root's alone."""


def resolve_trusted(root: str, path: str) -> tuple[str, os.stat_result]:
    """`path` (absolute, as seen inside `root`) resolved inside `root`: the link-free path
    ("/..." inside the root) and the final component's `lstat`; UntrustedPath otherwise."""
    st = _lstat(root)
    _check(st, "the driver root")
    parts = _split(path)
    done = ""
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done.rsplit("/", 1)[0]
            st = _lstat(os.path.join(root, done.lstrip("/")))
            continue
        host = os.path.join(root, (done + "/" + part).lstrip("/"))
        st = _lstat(host)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0:
                raise UntrustedPath(f"the link {done}/{part} is not root's")
            links += 1
            if links > MAX_LINKS:
                raise UntrustedPath(f"more than {MAX_LINKS} links")
            target = os.readlink(host)
            if target.startswith("/"):
                done = ""
            parts = _split(target) + parts
            continue
        _check(st, f"{done}/{part}")
        if parts and not stat.S_ISDIR(st.st_mode):
            raise UntrustedPath(f"{done}/{part} is not a directory")
        done = f"{done}/{part}"
    return done or "/", st


def _split(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _lstat(path: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except OSError as e:
        raise UntrustedPath(str(e)) from e


def _check(st: os.stat_result, shown: str) -> None:
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_uid != 0 or (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir):
        raise UntrustedPath(f"{shown} is not owned by root, or is writable by group or others")
